#!/usr/bin/env python3
"""The GPU figures as one table: baton_gpu_bench's runs beside torch_gpu_peer.py's.

    gpu_table.py --baton B1.json [B2.json ...] [--torch T1.json ...] [--peak-tflops 989]

Each JSON holds {"runs": [...]} in baton_gpu_bench's format (a missing or unreadable file is
skipped with a note). For every (preset, dtype) run: prefill tokens/s with truncation off and
compact, decode ms/step by batch (also replayed as one CUDA graph), each as model TFLOP/s, as a fraction of the GPU's dense BF16
peak (989 TFLOP/s for an H200 SXM by its datasheet; --peak-tflops for a measured ceiling), and
as baton's speed over PyTorch's on the same shapes in the same run.

Model FLOPs count what the pass must compute: every GEMM (2 flops per multiply-add), and
attention as 4 * heads * head_dim per (query row, visible key): producer rows see up to W SWA
keys; consumer rows see block KV [0, pos] plus up to W SWA keys; compact runs the consumers
over the last K rows only (consumer_rows); prefill ends in one lm_head row, decode in one per
request. Norms, RoPE, SwiGLU and sampling are left out (a few percent at most).
"""
import argparse
import json
import sys


def load(paths, what):
    runs = []
    meta = {}
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"note: {what} {path} not read ({e.__class__.__name__})")
            continue
        runs.extend(data.get("runs", []))
        for key in ("torch", "device"):
            if key in data:
                meta[key] = data[key]
    return runs, meta


def layer_gemm_flops(r):
    d, inter = r["d"], r["inter"]
    q_dim, kv_dim = r["heads"] * r["head_dim"], r["kv_heads"] * r["head_dim"]
    return 2 * (d * (q_dim + 2 * kv_dim) + q_dim * d + d * 2 * inter + inter * d)


def global_kv_flops(r):
    kv_dim = r["kv_heads"] * r["head_dim"]
    return 2 * r["d"] * (r["layers"] - r["producers"]) * 2 * kv_dim


def attention_flops(r, keys):
    return 4 * r["heads"] * r["head_dim"] * keys


def prefill_flops(r, p):
    L, rows, W = p["length"], p["consumer_rows"], r["window"]
    producers, consumers = r["producers"], r["layers"] - r["producers"]
    swa_keys = sum(min(i + 1, W) for i in range(L))
    flops = producers * (L * layer_gemm_flops(r) + attention_flops(r, swa_keys))
    flops += L * global_kv_flops(r)
    consumer_keys = sum((i + 1) + min(i + 1, W) for i in range(L - rows, L))
    flops += consumers * (rows * layer_gemm_flops(r) + attention_flops(r, consumer_keys))
    return flops + 2 * r["d"] * r["vocab"]


def decode_flops(r, dec):
    b, ctx, W = dec["batch"], dec["context"], r["window"]
    producers, consumers = r["producers"], r["layers"] - r["producers"]
    per_row = r["layers"] * layer_gemm_flops(r) + global_kv_flops(r) + 2 * r["d"] * r["vocab"]
    per_row += producers * attention_flops(r, W) + consumers * attention_flops(r, ctx + 1 + W)
    return b * per_row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baton", nargs="*", default=[])
    ap.add_argument("--torch", nargs="*", default=[])
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    args = ap.parse_args()
    baton, _ = load(args.baton, "baton")
    torch_runs, meta = load(args.torch, "torch")
    peak = args.peak_tflops
    if meta:
        print(f"peer: torch {meta.get('torch', '?')} on {meta.get('device', '?')}")
    print(f"TFLOP/s are model FLOPs over time; 'peak' is the fraction of {peak:.0f} TFLOP/s dense BF16")
    peer = {(r["preset"], r["dtype"]): r for r in torch_runs}
    for run in baton:
        t = peer.get((run["preset"], run["dtype"]))
        print(f"\n{run['preset']} {run['dtype']}: d {run['d']}, {run['heads']} heads x {run['head_dim']}, "
              f"GQA {run['kv_heads']}, {run['layers']} layers ({run['producers']} producers)")
        print("  prefill      L  mode     attention  baton tok/s  TFLOP/s   peak  torch tok/s  TFLOP/s  baton/torch")
        tp = {(p["length"], p["mode"]): p for p in (t["prefill"] if t else [])}
        for p in run["prefill"]:
            tflops = prefill_flops(run, p) / (p["ms"] / 1e3) / 1e12
            q = tp.get((p["length"], p["mode"]))
            if q:
                q_tflops = prefill_flops(run, q) / (q["ms"] / 1e3) / 1e12
                qs = f"{q['tokens_per_s']:11.0f}  {q_tflops:7.1f}  {p['tokens_per_s'] / q['tokens_per_s']:11.2f}"
            else:
                qs = f"{'-':>11}  {'-':>7}  {'-':>11}"
            print(f"          {p['length']:6d}  {p['mode']:7s}  {p.get('attention', 'simple'):9s} "
                  f"{p['tokens_per_s']:11.0f}  {tflops:7.1f}  {tflops / peak:5.3f}  {qs}")
        print("  decode  batch  context  baton ms/step  TFLOP/s   peak  graph ms/step  torch ms/step  baton/torch")
        td = {d["batch"]: d for d in (t["decode"] if t else [])}
        for dec in run["decode"]:
            tflops = decode_flops(run, dec) / (dec["step_ms"] / 1e3) / 1e12
            q = td.get(dec["batch"])
            qs = (f"{q['step_ms']:13.3f}  {q['step_ms'] / dec['step_ms']:11.2f}" if q
                  else f"{'-':>13}  {'-':>11}")
            graph = dec.get("graph_step_ms")
            gs = f"{graph:13.3f}" if graph else f"{'-':>13}"
            print(f"         {dec['batch']:5d}  {dec['context']:7d}  {dec['step_ms']:13.3f}  {tflops:7.2f}  "
                  f"{tflops / peak:5.3f}  {gs}  {qs}")
            if dec.get("graph_error"):
                print(f"           graph capture failed: {dec['graph_error']}")
    if not baton:
        print("no baton figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
