#!/usr/bin/env python3
"""PyTorch on the GPU running the layer stack of bench/gpu_bench.cc, as its peer.

Same shapes (the small preset, and a d=4096 / 32 heads of 128 / GQA 8 stack), same pass:
producer layers with window-W attention over every row, the boundary's shared rows projected
to every consumer layer's block KV, consumer layers over all rows (off) or the last K
(compact) with one softmax over block KV [0, i] and SWA keys [lo_i, i], final norm and
lm_head; decode steps at batch 1, 8, 64 against caches of --decode-context positions.
Attention is torch's scaled_dot_product_attention with a boolean mask (union = keys of both
sources concatenated). fp32 runs keep TF32 off (as baton's cuBLAS FP32 path); bf16 runs put
weights and activations in bf16 (PyTorch's usual serving setup; baton keeps activations FP32).

Prints one JSON object in baton_gpu_bench's format. Exits 2 when torch has no CUDA device
(unless --device cpu, a slow path for checking this script on a machine without a GPU).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "small": dict(d=512, inter=1536, heads=8, kv_heads=1, head_dim=64, window=128, capacity=134,
                  layers=16, producers=8, vocab=4096),
    "large": dict(d=4096, inter=14336, heads=32, kv_heads=8, head_dim=128, window=128,
                  capacity=134, layers=32, producers=16, vocab=128256),
    # Only for checking the script on a CPU.
    "tiny": dict(d=128, inter=384, heads=4, kv_heads=1, head_dim=32, window=16, capacity=22,
                 layers=4, producers=2, vocab=512),
}


def sdpa(q, k, v, attn_mask=None):
    """F.scaled_dot_product_attention where torch has it (>= 2.0), else the same in matmuls."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    scores = (q @ k.transpose(-1, -2)).float() / q.shape[-1] ** 0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return (torch.softmax(scores, -1).to(v.dtype)) @ v


class Stack:
    def __init__(self, s, dtype, device):
        self.s, self.dtype, self.device = s, dtype, device
        d, hd = s["d"], s["head_dim"]
        self.q_dim, self.kv_dim = s["heads"] * hd, s["kv_heads"] * hd
        # Made where they are used, in their own dtype: CPU torch.rand took tens of seconds per
        # dtype for the d = 4096 stack, a good part of a GPU lease.
        gen = torch.Generator(device=device).manual_seed(0)

        def linear(out, inp):
            w = torch.rand(out, inp, generator=gen, device=device, dtype=dtype)
            return w.mul_(2).sub_(1).div_(inp ** 0.5)

        self.layers = []
        for _ in range(s["layers"]):
            self.layers.append(dict(qkv=linear(self.q_dim + 2 * self.kv_dim, d), o=linear(d, self.q_dim),
                                    gate_up=linear(2 * s["inter"], d), down=linear(d, s["inter"])))
        self.consumers = s["layers"] - s["producers"]
        self.global_kv = linear(self.consumers * 2 * self.kv_dim, d)
        self.lm_head = linear(s["vocab"], d)
        half = hd // 2
        self.inv_freq = torch.tensor([10000.0 ** (-2.0 * k / hd) for k in range(half)],
                                     dtype=torch.float64, device=device)

    def norm(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def rope(self, x, positions):
        # x [rows, heads, hd], rotate_half convention.
        angle = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([angle.cos(), angle.cos()], -1).to(x.dtype)[:, None, :]
        sin = torch.cat([angle.sin(), angle.sin()], -1).to(x.dtype)[:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def attend(self, q, k, v, mask):
        # q [rows, H, hd], k/v [keys, Hkv, hd], mask [rows, keys] (True = visible).
        group = self.s["heads"] // self.s["kv_heads"]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def mlp(self, w, h):
        gate, up = (self.norm(h) @ w["gate_up"].T).chunk(2, -1)
        return h + (F.silu(gate) * up) @ w["down"].T

    def qkv(self, w, h, positions):
        s = self.s
        qkv = self.norm(h) @ w["qkv"].T
        q = qkv[:, :self.q_dim].reshape(-1, s["heads"], s["head_dim"])
        k = qkv[:, self.q_dim:self.q_dim + self.kv_dim].reshape(-1, s["kv_heads"], s["head_dim"])
        v = qkv[:, self.q_dim + self.kv_dim:].reshape(-1, s["kv_heads"], s["head_dim"])
        return self.rope(q, positions), self.rope(k, positions), v

    def prefill(self, h, keep):
        """One chunk of L rows from position 0; keep < 0: off, else compact with K = keep."""
        s, L = self.s, h.shape[0]
        pos = torch.arange(L, device=self.device)
        W = s["window"]
        swa_mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= pos[:, None] - W + 1)
        for w in self.layers[:s["producers"]]:
            q, k, v = self.qkv(w, h, pos)
            h = h + self.attend(q, k, v, swa_mask) @ w["o"].T
            h = self.mlp(w, h)
        shared = self.norm(h)
        glob = (shared @ self.global_kv.T).reshape(L, self.consumers, 2, s["kv_heads"], s["head_dim"])
        s_keep = 0 if keep < 0 else max(0, L - keep)
        begin = 0 if keep < 0 else min(s_keep, L - 1)
        hc, cpos = h[begin:], pos[begin:]
        lo = torch.clamp(torch.maximum(cpos - W + 1, torch.full_like(cpos, s_keep)), min=0)
        global_mask = pos[None, :] <= cpos[:, None]
        swa = (cpos[None, :] <= cpos[:, None]) & (cpos[None, :] >= lo[:, None])
        mask = torch.cat([global_mask, swa], 1)
        for i, w in enumerate(self.layers[s["producers"]:]):
            kg = self.rope(glob[:, i, 0], pos)
            vg = glob[:, i, 1]
            q, k, v = self.qkv(w, hc, cpos)
            attn = self.attend(q, torch.cat([kg, k]), torch.cat([vg, v]), mask)
            hc = hc + attn @ w["o"].T
            hc = self.mlp(w, hc)
        return self.norm(hc[-1:]) @ self.lm_head.T

    def decode(self, h, caches, context):
        """One step for a batch: h [b, d] at position `context`, caches per consumer layer."""
        s, b = self.s, h.shape[0]
        pos = torch.full((b,), context, device=self.device)
        for li, w in enumerate(self.layers[:s["producers"]]):
            q, k, v = self.qkv(w, h, pos)
            ring_k, ring_v = caches["producer"][li]
            keys = torch.cat([ring_k, k[:, None]], 1)  # [b, W, Hkv, hd]
            vals = torch.cat([ring_v, v[:, None]], 1)
            h = h + self.batched_attend(q, keys, vals) @ w["o"].T
            h = self.mlp(w, h)
        shared = self.norm(h)
        glob = (shared @ self.global_kv.T).reshape(b, self.consumers, 2, s["kv_heads"], s["head_dim"])
        for i, w in enumerate(self.layers[s["producers"]:]):
            gk, gv, ring_k, ring_v = caches["consumer"][i]
            kg = self.rope(glob[:, i, 0], pos)
            q, k, v = self.qkv(w, h, pos)
            keys = torch.cat([gk, kg[:, None], ring_k, k[:, None]], 1)
            vals = torch.cat([gv, glob[:, i, 1][:, None], ring_v, v[:, None]], 1)
            h = h + self.batched_attend(q, keys, vals) @ w["o"].T
            h = self.mlp(w, h)
        logits = (self.norm(h) @ self.lm_head.T).float()
        probs = torch.softmax(logits / 0.8, -1)
        return torch.multinomial(probs, 1)

    def batched_attend(self, q, keys, vals):
        # q [b, H, hd]; keys/vals [b, n, Hkv, hd]; every key visible.
        group = self.s["heads"] // self.s["kv_heads"]
        k = keys.repeat_interleave(group, dim=2).transpose(1, 2)
        v = vals.repeat_interleave(group, dim=2).transpose(1, 2)
        out = sdpa(q[:, :, None], k, v)
        return out.reshape(q.shape[0], -1)


def timed_ms(device, repeats, fn):
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,large")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--keep", type=int, default=140)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--decode-context", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpu_peer: torch sees no CUDA device (torch %s, built with CUDA %s)"
              % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = args.device
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
              "runs": []}
    for preset in args.presets.split(","):
        s = SHAPES[preset]
        for dtype_name in args.dtypes.split(","):
            dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
            run = {"preset": preset, "dtype": dtype_name, "d": s["d"], "heads": s["heads"],
                   "kv_heads": s["kv_heads"], "head_dim": s["head_dim"], "layers": s["layers"],
                   "producers": s["producers"], "inter": s["inter"], "vocab": s["vocab"],
                   "window": s["window"], "prefill": [], "decode": []}
            stack = Stack(s, dtype, device)
            with torch.inference_mode():
                for L in [int(x) for x in args.lengths.split(",")]:
                    h = torch.rand(L, s["d"], device=device, dtype=dtype) * 2 - 1
                    for mode in ("off", "compact"):
                        keep = -1 if mode == "off" else args.keep
                        ms = timed_ms(device, args.repeats, lambda: stack.prefill(h, keep))
                        rows = L if keep < 0 else min(L, keep)
                        run["prefill"].append({"length": L, "mode": mode, "consumer_rows": rows, "ms": ms,
                                               "tokens_per_s": L / (ms / 1e3)})
                ctx = args.decode_context
                for b in [int(x) for x in args.batches.split(",")]:
                    def cache(n):
                        return torch.rand(b, n, s["kv_heads"], s["head_dim"], device=device, dtype=dtype)
                    W = s["window"]
                    caches = {"producer": [(cache(W - 1), cache(W - 1)) for _ in range(s["producers"])],
                              "consumer": [(cache(ctx), cache(ctx), cache(W - 1), cache(W - 1))
                                           for _ in range(stack.consumers)]}
                    h = torch.rand(b, s["d"], device=device, dtype=dtype) * 2 - 1
                    ms = timed_ms(device, args.repeats, lambda: stack.decode(h, caches, ctx))
                    run["decode"].append({"batch": b, "context": ctx, "step_ms": ms,
                                          "tokens_per_s": b / (ms / 1e3)})
                    del caches
            del stack
            if device == "cuda":
                torch.cuda.empty_cache()
            result["runs"].append(run)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
