#!/usr/bin/env bash
# GPU figures in one run: baton's CUDA kernels on CED layer stacks (baton_gpu_bench) and
# PyTorch on the same shapes (bench/torch_gpu_peer.py), side by side: prefill tokens/s for
# truncation off and compact, decode ms/step at batch 1, 8, 64; small preset and a d=4096 /
# 32-head stack; FP32 and BF16 GEMMs.
#
#   bench/run_gpu_bench.sh            (OUT=dir for the JSON and the table, default ./gpu-out)
# Environment: BATON_BUILD_DIR (a build with -DBATON_WITH_CUDA=ON, default build-gpu),
# PRESETS, DTYPES, LENGTHS, BATCHES, DECODE_CONTEXT, REPEATS,
# PROGRAM_TIMEOUT (s per program, default 270), PYTHON (default python3). The peer is skipped, with a note, when torch has no CUDA.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
args=(--presets "${PRESETS:-small,large}" --dtypes "${DTYPES:-fp32,bf16}"
      --lengths "${LENGTHS:-1024,4096}" --batches "${BATCHES:-1,8,64}"
      --decode-context "${DECODE_CONTEXT:-2048}" --repeats "${REPEATS:-3}")
limit="${PROGRAM_TIMEOUT:-270}"
tag="${TAG:-}"

echo "+ $build/bench/baton_gpu_bench ${args[*]} --json" >&2
timeout "$limit" "$build/bench/baton_gpu_bench" "${args[@]}" --json >"$out/baton_gpu${tag}.json"

peer_ok=1
echo "+ ${PYTHON:-python3} $root/bench/torch_gpu_peer.py ${args[*]}" >&2
if ! timeout "$limit" "${PYTHON:-python3}" "$root/bench/torch_gpu_peer.py" "${args[@]}" \
    >"$out/torch_gpu${tag}.json" 2>"$out/torch_gpu${tag}.err"; then
  peer_ok=0
  echo "torch peer did not run (see $out/torch_gpu${tag}.err); baton figures only" >&2
fi

"${PYTHON:-python3}" - "$out/baton_gpu${tag}.json" "$out/torch_gpu${tag}.json" "$peer_ok" <<'PY' | tee "$out/gpu_bench_table${tag}.txt"
import json, sys
baton = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2])) if sys.argv[3] == "1" else {"runs": []}
peer = {(r["preset"], r["dtype"]): r for r in torch["runs"]}
if torch.get("torch"):
    print(f"peer: torch {torch['torch']} on {torch['device']}")
for run in baton["runs"]:
    t = peer.get((run["preset"], run["dtype"]))
    print(f"{run['preset']} {run['dtype']}: d {run['d']}, {run['heads']} heads x {run['head_dim']}, "
          f"GQA {run['kv_heads']}, {run['layers']} layers ({run['producers']} producers)")
    print("  prefill      L  mode     baton tok/s  torch tok/s  baton/torch")
    tp = {(p["length"], p["mode"]): p for p in (t["prefill"] if t else [])}
    for p in run["prefill"]:
        q = tp.get((p["length"], p["mode"]))
        qs = f"{q['tokens_per_s']:11.0f}  {p['tokens_per_s'] / q['tokens_per_s']:11.2f}" if q else "          -            -"
        print(f"          {p['length']:6d}  {p['mode']:7s} {p['tokens_per_s']:11.0f}  {qs}")
    by_len = {}
    for p in run["prefill"]:
        by_len.setdefault(p["length"], {})[p["mode"]] = p
    for length, modes in sorted(by_len.items()):
        if "off" in modes and "compact" in modes:
            print(f"  L={length}: compact/off time {modes['compact']['ms'] / modes['off']['ms']:.3f}")
    print("  decode  batch  context  baton ms/step  torch ms/step  torch/baton")
    td = {d["batch"]: d for d in (t["decode"] if t else [])}
    for d in run["decode"]:
        q = td.get(d["batch"])
        qs = f"{q['step_ms']:13.3f}  {q['step_ms'] / d['step_ms']:11.2f}" if q else "            -            -"
        print(f"         {d['batch']:5d}  {d['context']:7d}  {d['step_ms']:13.3f}  {qs}")
PY
