#!/usr/bin/python3
"""The same CED model in PyTorch eager, as the peer for baton's CPU figures.

Reads a baton model directory (config.json + model.safetensors, parsed here with json and
numpy), follows DESIGN section 2 with dense masked attention, and times prefill (off and
compact, one chunk) and batched decode steps on the same prompts as bench/model_bench.cc.
With --check FILE (the JSON of `batonctl forward --json` on --check-tokens) it also prints how
far its logits are from baton's. Run with Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import json
import statistics
import struct
import time

import numpy as np
import torch


def load(model_dir):
    config = json.load(open(f"{model_dir}/config.json"))
    raw = open(f"{model_dir}/model.safetensors", "rb").read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data = raw[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] == "F32":
            array = np.frombuffer(data[begin:end], dtype=np.float32)
        else:
            array = (np.frombuffer(data[begin:end], dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(array.copy()).reshape(info["shape"])
    return config, tensors


class Ced:
    def __init__(self, config, t):
        self.c, self.t = config, t
        self.P, self.N = config["n_prefill_layer"], config["num_hidden_layers"]
        self.H, self.Hkv, self.hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        self.W = config["sliding_window"]
        self.C = self.W + config.get("max_backtrack", 5) + 1
        half = self.hd // 2
        self.inv_freq = torch.tensor([config["rope_theta"] ** (-2.0 * k / self.hd) for k in range(half)], dtype=torch.float64)
        self.lm_head = t["model.embed_tokens.weight"] if config["tie_word_embeddings"] else t["lm_head.weight"]

    def w(self, layer, name):
        return self.t[f"model.layers.{layer}.{name}"]

    def source(self, layer):
        """The block-KV source consumer layer `layer` reads: the nearest of block_kv_sources at
        or below it (itself without the field)."""
        sources = self.c.get("block_kv_sources") or [layer]
        return max(s for s in sources if s <= layer)

    def norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * weight

    def rope(self, x, positions, heads):
        # x [..., rows, heads*hd]; rotate_half convention.
        angle = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([angle.cos(), angle.cos()], -1).float()
        sin = torch.cat([angle.sin(), angle.sin()], -1).float()
        x = x.unflatten(-1, (heads, self.hd))
        half = self.hd // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x * cos[:, None, :] + rotated * sin[:, None, :]).flatten(-2)

    def attend(self, q, k, v, mask):
        # q [rows, H*hd], k/v [keys, Hkv*hd], mask [rows, keys] bool (True = visible).
        q = q.unflatten(-1, (self.H, self.hd)).transpose(0, 1)
        k = k.unflatten(-1, (self.Hkv, self.hd)).transpose(0, 1).repeat_interleave(self.H // self.Hkv, 0)
        v = v.unflatten(-1, (self.Hkv, self.hd)).transpose(0, 1).repeat_interleave(self.H // self.Hkv, 0)
        scores = (q @ k.transpose(1, 2)) / self.hd ** 0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ v).transpose(0, 1).flatten(-2)

    def mlp(self, h, layer):
        y = self.norm(h, self.w(layer, "mlp_norm.weight"))
        gate = y @ self.w(layer, "mlp.gate_proj.weight").T
        up = y @ self.w(layer, "mlp.up_proj.weight").T
        return h + (torch.nn.functional.silu(gate) * up) @ self.w(layer, "mlp.down_proj.weight").T

    def prefill(self, tokens, keep=None):
        """One-chunk prefill; keep=None is off, else compact with K=keep. Returns last-row logits
        and the decode cache."""
        L = len(tokens)
        pos = torch.arange(L)
        h = self.t["model.embed_tokens.weight"][torch.tensor(tokens)]
        cache = {"producer": [], "global": [], "consumer": [], "length": L}
        window = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.W)
        for l in range(self.P):
            x = self.norm(h, self.w(l, "attn_norm.weight"))
            q = self.rope(x @ self.w(l, "self_attn.q_proj.weight").T, pos, self.H)
            k = self.rope(x @ self.w(l, "self_attn.k_proj.weight").T, pos, self.Hkv)
            v = x @ self.w(l, "self_attn.v_proj.weight").T
            h = h + self.attend(q, k, v, window) @ self.w(l, "self_attn.o_proj.weight").T
            h = self.mlp(h, l)
            cache["producer"].append((k[-self.W :], v[-self.W :]))
        s = self.norm(h, self.w(self.P, "attn_norm.weight"))
        first = 0 if keep is None else max(0, L - keep)
        s_keep = first
        rows = pos[first:]
        hc, sc = h[first:], s[first:]
        causal = pos[None, :] <= rows[:, None]
        swa = (pos[None, first:] <= rows[:, None]) & (pos[None, first:] > rows[:, None] - self.W) & (pos[None, first:] >= s_keep)
        for l in range(self.P, self.N):
            kg = self.rope(s @ self.w(self.source(l), "self_attn.global_k_proj.weight").T, pos, self.Hkv)
            vg = s @ self.w(self.source(l), "self_attn.global_v_proj.weight").T
            x = self.norm(hc, self.w(l, "attn_norm.weight"))
            src = sc if self.c.get("yoco_swa_share_hidden") else x
            q = self.rope(x @ self.w(l, "self_attn.q_proj.weight").T, rows, self.H)
            ks = self.rope(src @ self.w(l, "self_attn.swa_k_proj.weight").T, rows, self.Hkv)
            vs = src @ self.w(l, "self_attn.swa_v_proj.weight").T
            out = self.attend(q, torch.cat([kg, ks]), torch.cat([vg, vs]), torch.cat([causal, swa], 1))
            hc = hc + out @ self.w(l, "self_attn.o_proj.weight").T
            hc = self.mlp(hc, l)
            cache["global"].append((kg, vg))
            cache["consumer"].append((ks[-self.W :], vs[-self.W :]))
        logits = self.norm(hc, self.t["model.norm.weight"]) @ self.lm_head.T
        return logits, cache

    @staticmethod
    def stack(caches):
        """Batches per-request prefill caches of equal length into [B, n, kv] tensors."""
        def group(key):
            return [(torch.stack([c[key][l][0] for c in caches]), torch.stack([c[key][l][1] for c in caches]))
                    for l in range(len(caches[0][key]))]
        return {"producer": group("producer"), "global": group("global"), "consumer": group("consumer"),
                "length": caches[0]["length"]}

    def decode(self, tokens, cache):
        """One step for a stacked batch cache (see stack); returns logits [batch, V]."""
        t = cache["length"]
        pos = torch.tensor([t])
        h = self.t["model.embed_tokens.weight"][torch.tensor(tokens)]

        def step_attention(q, keys, values):
            # q [B, H*hd], keys/values [B, n, Hkv*hd]: batched one-row attention, all visible.
            qh = q.unflatten(-1, (self.H, self.hd))
            kh = keys.unflatten(-1, (self.Hkv, self.hd)).repeat_interleave(self.H // self.Hkv, 2)
            vh = values.unflatten(-1, (self.Hkv, self.hd)).repeat_interleave(self.H // self.Hkv, 2)
            scores = torch.einsum("bhd,bnhd->bhn", qh, kh) / self.hd ** 0.5
            return torch.einsum("bhn,bnhd->bhd", scores.softmax(-1), vh).flatten(-2)

        for l in range(self.P):
            x = self.norm(h, self.w(l, "attn_norm.weight"))
            q = self.rope(x @ self.w(l, "self_attn.q_proj.weight").T, pos, self.H)
            k = self.rope(x @ self.w(l, "self_attn.k_proj.weight").T, pos, self.Hkv)
            v = x @ self.w(l, "self_attn.v_proj.weight").T
            old_k, old_v = cache["producer"][l]
            keys = torch.cat([old_k[:, -(self.W - 1):], k[:, None]], 1)
            values = torch.cat([old_v[:, -(self.W - 1):], v[:, None]], 1)
            h = h + step_attention(q, keys, values) @ self.w(l, "self_attn.o_proj.weight").T
            h = self.mlp(h, l)
            cache["producer"][l] = (keys, values)
        s = self.norm(h, self.w(self.P, "attn_norm.weight"))
        for j, l in enumerate(range(self.P, self.N)):
            kg = self.rope(s @ self.w(self.source(l), "self_attn.global_k_proj.weight").T, pos, self.Hkv)
            vg = s @ self.w(self.source(l), "self_attn.global_v_proj.weight").T
            x = self.norm(h, self.w(l, "attn_norm.weight"))
            src = s if self.c.get("yoco_swa_share_hidden") else x
            q = self.rope(x @ self.w(l, "self_attn.q_proj.weight").T, pos, self.H)
            ks = self.rope(src @ self.w(l, "self_attn.swa_k_proj.weight").T, pos, self.Hkv)
            vs = src @ self.w(l, "self_attn.swa_v_proj.weight").T
            gk = torch.cat([cache["global"][j][0], kg[:, None]], 1)
            gv = torch.cat([cache["global"][j][1], vg[:, None]], 1)
            sk = torch.cat([cache["consumer"][j][0][:, -(self.W - 1):], ks[:, None]], 1)
            sv = torch.cat([cache["consumer"][j][1][:, -(self.W - 1):], vs[:, None]], 1)
            out = step_attention(q, torch.cat([gk, sk], 1), torch.cat([gv, sv], 1))
            h = h + out @ self.w(l, "self_attn.o_proj.weight").T
            h = self.mlp(h, l)
            cache["global"][j] = (gk, gv)
            cache["consumer"][j] = (sk, sv)
        cache["length"] += 1
        return self.norm(h, self.t["model.norm.weight"]) @ self.lm_head.T


def median_seconds(repeats, fn):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prompt(length, vocab, seed):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, vocab, length)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--keep", type=int, default=140)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--decode-context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--check", help="batonctl forward --json output to compare against")
    parser.add_argument("--check-tokens", help="the tokens given to batonctl forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, tensors = load(args.model)
    model = Ced(config, tensors)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "prefill": [], "decode": []}
    with torch.inference_mode():
        if args.check:
            baton = json.load(open(args.check))
            tokens = [int(x) for x in args.check_tokens.split(",")]
            logits, _ = model.prefill(tokens)
            ours = torch.tensor(baton["logits"][-1])
            out["check_max_abs_diff_last_row"] = float((logits[-1] - ours).abs().max())
            out["check_max_abs_logit"] = float(ours.abs().max())
        for length in [int(x) for x in args.lengths.split(",")]:
            tokens = prompt(length, config["vocab_size"], 1)
            for keep in (None, args.keep):
                seconds = median_seconds(args.repeats, lambda: model.prefill(tokens, keep))
                out["prefill"].append({"length": length, "mode": "off" if keep is None else "compact",
                                       "seconds": seconds, "tokens_per_s": length / seconds})
        for batch in [int(x) for x in args.batches.split(",")]:
            cache = Ced.stack([model.prefill(prompt(args.decode_context, config["vocab_size"], 100 + i), args.keep)[1]
                               for i in range(batch)])
            steps = 8
            seconds = median_seconds(args.repeats, lambda: [model.decode([7] * batch, cache) for _ in range(steps)]) / steps
            out["decode"].append({"batch": batch, "step_ms": seconds * 1e3})
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
