"""The CED model of DESIGN section 2 as a PyTorch module, for training.

Module and parameter names are the safetensors names baton loads (model.layers.L.self_attn.
q_proj.weight, ...), so the state dict is the weights file. A batch may carry a truncation per
sequence: `s_keep[b]` > 0 narrows every consumer layer's SWA visibility to keys j >= s_keep[b]
for all rows, which is DESIGN section 3's lo_i = max(i - W + 1, s_keep) for a prompt of length
L = s_keep + K: the retained rows, and the tokens generated after the prompt (whose window
starts past L - W + 1 > L - K), see exactly what baton's mask and compact modes give them.
Producers and the block KV (global keys) are never truncated.
"""
import math

import torch
from torch import nn


class RmsNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def block_kv_sources(config):
    """The consumer layers that project block KV: config's block_kv_sources, else every one."""
    P, N = config["n_prefill_layer"], config["num_hidden_layers"]
    return list(config.get("block_kv_sources") or range(P, N))


class Attention(nn.Module):
    """Projections of one layer: k_proj/v_proj for a producer, swa_* for a consumer, and
    global_* for a consumer that is a block-KV source."""

    def __init__(self, config, consumer, source=False):
        super().__init__()
        d, H, Hkv, hd = (config["hidden_size"], config["num_attention_heads"],
                         config["num_key_value_heads"], config["head_dim"])
        self.q_proj = nn.Linear(d, H * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, d, bias=False)
        if consumer:
            self.swa_k_proj = nn.Linear(d, Hkv * hd, bias=False)
            self.swa_v_proj = nn.Linear(d, Hkv * hd, bias=False)
            if source:
                self.global_k_proj = nn.Linear(d, Hkv * hd, bias=False)
                self.global_v_proj = nn.Linear(d, Hkv * hd, bias=False)
        else:
            self.k_proj = nn.Linear(d, Hkv * hd, bias=False)
            self.v_proj = nn.Linear(d, Hkv * hd, bias=False)


class Mlp(nn.Module):
    def __init__(self, d, inner):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, y):
        return self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))


class Layer(nn.Module):
    def __init__(self, config, consumer, source=False):
        super().__init__()
        d, eps = config["hidden_size"], config["rms_norm_eps"]
        self.attn_norm = RmsNorm(d, eps)
        self.self_attn = Attention(config, consumer, source)
        self.mlp_norm = RmsNorm(d, eps)
        self.mlp = Mlp(d, config["intermediate_size"])


class Body(nn.Module):
    def __init__(self, config):
        super().__init__()
        P, N = config["n_prefill_layer"], config["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        sources = block_kv_sources(config)
        self.layers = nn.ModuleList(Layer(config, l >= P, l in sources) for l in range(N))
        self.norm = RmsNorm(config["hidden_size"], config["rms_norm_eps"])


class Ced(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config["tie_word_embeddings"], "the trainer writes tied embeddings"
        assert not config.get("yoco_swa_share_hidden", False)
        self.config = config
        self.model = Body(config)
        self.P, self.N = config["n_prefill_layer"], config["num_hidden_layers"]
        self.H, self.Hkv, self.hd = (config["num_attention_heads"],
                                     config["num_key_value_heads"], config["head_dim"])
        self.W = config["sliding_window"]
        half = self.hd // 2
        self.inv_freq = torch.tensor(
            [config["rope_theta"] ** (-2.0 * k / self.hd) for k in range(half)], dtype=torch.float64)

    def init_weights(self, generator):
        """Normal(0, 0.02) matrices, output projections scaled by 1/sqrt(2N), unit norms."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
                continue
            std = 0.02
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                std /= math.sqrt(2 * self.N)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * std)

    def rope_tables(self, T):
        angle = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([angle.cos(), angle.cos()], -1).float()
        sin = torch.cat([angle.sin(), angle.sin()], -1).float()
        return cos, sin

    def heads(self, x, n):
        # [B, T, n*hd] -> [B, n, T, hd]
        B, T, _ = x.shape
        return x.view(B, T, n, self.hd).transpose(1, 2)

    def rope(self, x, cos, sin):
        half = self.hd // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def expand(self, kv):
        return kv.repeat_interleave(self.H // self.Hkv, dim=1)

    def merge(self, x):
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.H * self.hd)

    def forward(self, tokens, s_keep=None):
        """tokens [B, T] -> logits [B, T, V]; s_keep [B] (0: no truncation)."""
        B, T = tokens.shape
        cos, sin = self.rope_tables(T)
        i = torch.arange(T)
        causal = i[None, :] <= i[:, None]
        window = causal & (i[None, :] > i[:, None] - self.W)
        neg = torch.finfo(torch.float32).min
        window_bias = torch.zeros(T, T).masked_fill(~window, neg)
        causal_bias = torch.zeros(T, T).masked_fill(~causal, neg)
        if s_keep is None:
            swa_bias = window_bias[None, None]
        else:
            visible = window[None] & (i[None, None, :] >= s_keep[:, None, None])
            swa_bias = torch.zeros(B, 1, T, T).masked_fill(~visible[:, None], neg)
        scale = 1.0 / math.sqrt(self.hd)
        layers = self.model.layers
        h = self.model.embed_tokens(tokens)
        for l in range(self.P):
            layer = layers[l]
            a = layer.self_attn
            x = layer.attn_norm(h)
            q = self.rope(self.heads(a.q_proj(x), self.H), cos, sin)
            k = self.expand(self.rope(self.heads(a.k_proj(x), self.Hkv), cos, sin))
            v = self.expand(self.heads(a.v_proj(x), self.Hkv))
            scores = (q @ k.transpose(-1, -2)) * scale + window_bias
            h = h + a.o_proj(self.merge(scores.softmax(-1) @ v))
            h = h + layer.mlp(layer.mlp_norm(h))
        s = layers[self.P].attn_norm(h)
        for l in range(self.P, self.N):
            layer = layers[l]
            a = layer.self_attn
            x = layer.attn_norm(h)
            q = self.rope(self.heads(a.q_proj(x), self.H), cos, sin)
            # A block-KV source projects its block KV from s; the layers above it up to the
            # next source read the same kg, vg.
            if hasattr(a, "global_k_proj"):
                kg = self.expand(self.rope(self.heads(a.global_k_proj(s), self.Hkv), cos, sin))
                vg = self.expand(self.heads(a.global_v_proj(s), self.Hkv))
            ks = self.expand(self.rope(self.heads(a.swa_k_proj(x), self.Hkv), cos, sin))
            vs = self.expand(self.heads(a.swa_v_proj(x), self.Hkv))
            # One softmax over the global keys j <= i and the SWA keys lo_i <= j <= i.
            scores = torch.cat([(q @ kg.transpose(-1, -2)) * scale + causal_bias,
                                (q @ ks.transpose(-1, -2)) * scale + swa_bias], -1)
            out = scores.softmax(-1) @ torch.cat([vg, vs], 2)
            h = h + a.o_proj(self.merge(out))
            h = h + layer.mlp(layer.mlp_norm(h))
        return self.model.norm(h) @ self.model.embed_tokens.weight.T
