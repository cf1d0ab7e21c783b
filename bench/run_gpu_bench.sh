#!/usr/bin/env bash
# GPU figures in one run from a CUDA build on this machine: baton's CUDA kernels on CED layer
# stacks (baton_gpu_bench) and PyTorch on the same shapes (bench/torch_gpu_peer.py), side by
# side (bench/gpu_table.py): prefill tokens/s for truncation off and compact, decode ms/step at
# batch 1, 8, 64; small preset and a d=4096 / 32-head stack; FP32 and BF16 GEMMs; each also as
# model TFLOP/s and a fraction of the dense BF16 peak. On a bare GPU machine without a build,
# bench/run_gpu_checks.sh runs the same from the GPU bundle.
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
# The peer runs whether or not baton did: its figures are half of the comparison.
baton_ok=1
if ! timeout "$limit" "$build/bench/baton_gpu_bench" "${args[@]}" --json >"$out/baton_gpu${tag}.json"; then
  baton_ok=0
  echo "baton_gpu_bench failed or timed out" >&2
fi

peer_ok=1
echo "+ ${PYTHON:-python3} $root/bench/torch_gpu_peer.py ${args[*]}" >&2
if ! timeout "$limit" "${PYTHON:-python3}" "$root/bench/torch_gpu_peer.py" "${args[@]}" \
    >"$out/torch_gpu${tag}.json" 2>"$out/torch_gpu${tag}.err"; then
  peer_ok=0
  echo "torch peer did not run (see $out/torch_gpu${tag}.err); baton figures only" >&2
fi

peer_json=()
((peer_ok)) && peer_json=("$out/torch_gpu${tag}.json")
"${PYTHON:-python3}" "$root/bench/gpu_table.py" --baton "$out/baton_gpu${tag}.json" \
  --torch "${peer_json[@]}" | tee "$out/gpu_bench_table${tag}.txt"
((baton_ok))
