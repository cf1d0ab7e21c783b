#!/usr/bin/env bash
# Everything a session with a GPU runs, in one go: configure and build with CUDA, run the
# CPU/CUDA consistency harness (ops), the CUDA forward pass against the CPU one (model test on
# the tiny preset; `batonctl forward --device cuda` vs `--device cpu` on the small preset), the
# GPU benchmark and its PyTorch peer; everything lands under $OUT (default ./gpu-out):
# commands.log (what ran), summary.txt (one line per step with its exit status and seconds), a
# log per step, consistency.json and engine_backends.json (GoogleTest), forward_{cpu,cuda}.json
# (batonctl) and forward_compare.txt, the bench JSON and table. Steps go on after a failed step (the summary says which failed); the exit status is
# non-zero when any step failed.
#
#   OUT=/some/dir bench/run_gpu_checks.sh
# Environment:
#   STEPS            which steps, in order (default "env configure build test modeltest forward
#                    bench torchcheck")
#   BATON_BUILD_DIR  build directory (default build-gpu); with STEPS lacking configure/build,
#                    a build made elsewhere is used as is
#   JOBS             build parallelism (default nproc)
#   *_TIMEOUT        seconds per step: CONFIGURE (240), BUILD (600), TEST (240), MODELTEST (240),
#                    FORWARD (240), BENCH (570; two programs of PROGRAM_TIMEOUT = 270 each)
#   PRESETS, DTYPES, LENGTHS, BATCHES, DECODE_CONTEXT, REPEATS: passed to run_gpu_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export BATON_BUILD_DIR="${BATON_BUILD_DIR:-$root/build-gpu}"
build="$BATON_BUILD_DIR"
steps="${STEPS:-env configure build test modeltest forward bench torchcheck}"
jobs="${JOBS:-$(nproc)}"
failed=0

# step NAME TIMEOUT COMMAND...: runs COMMAND under timeout, output to $OUT/NAME.log, records
# the status; never stops the script.
step() {
  local name="$1" limit="$2"
  shift 2
  echo "+ [$name, timeout ${limit}s] $*" | tee -a "$OUT/commands.log"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local verdict="ok"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then verdict="TIMEOUT"; elif [[ $rc -ne 0 ]]; then verdict="FAILED"; fi
  [[ $rc -eq 0 ]] || failed=1
  printf '%-12s %-8s rc=%-4s %5ss\n' "$name" "$verdict" "$rc" "$((SECONDS - start))" | tee -a "$OUT/summary.txt"
  tail -n 5 "$OUT/$name.log" | sed "s/^/    [$name] /"
  return 0
}

generator=(-G Ninja)
command -v ninja >/dev/null || generator=()
for s in $steps; do
  case "$s" in
    env)
      step env 60 bash -c 'nvidia-smi || echo "nvidia-smi failed"; nvcc --version || /usr/local/cuda/bin/nvcc --version; cmake --version; g++ --version | head -1; ${PYTHON:-python3} -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available())" || echo "no torch"'
      ;;
    configure)
      step configure "${CONFIGURE_TIMEOUT:-240}" cmake -S "$root" -B "$build" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DBATON_WITH_CUDA=ON
      ;;
    build)
      step build "${BUILD_TIMEOUT:-600}" cmake --build "$build" -j "$jobs" --target \
        baton_kernels_cuda cuda_consistency_test engine_backends_test batonctl baton_gpu_bench
      ;;
    test)
      # On a GPU machine a skipped test is a failure of this check: the summary line says so.
      step test "${TEST_TIMEOUT:-240}" bash -c '
        "$0/tests/kernels/cuda_consistency_test" --gtest_output="json:$OUT/consistency.json"
        rc=$?
        if grep -q "\[  SKIPPED \]" "$OUT/test.log" 2>/dev/null; then echo "tests SKIPPED: no usable GPU?"; exit 3; fi
        exit $rc' "$build"
      ;;
    modeltest)
      # The engine on CUDA against the engine on the CPU (tiny preset, every truncation mode, decode); a skip fails.
      step modeltest "${MODELTEST_TIMEOUT:-240}" bash -c '
        "$0/tests/model/engine_backends_test" --gtest_output="json:$OUT/engine_backends.json"
        rc=$?
        if grep -q "\[  SKIPPED \]" "$OUT/modeltest.log" 2>/dev/null; then echo "tests SKIPPED: no usable GPU?"; exit 3; fi
        exit $rc' "$build"
      ;;
    forward)
      # One prompt of the small preset (C = 134) through both backends: compact K = C in chunks,
      # s_valid > 0, 8 greedy tokens. Same positions and tokens, logits within 1e-3 relative.
      step forward "${FORWARD_TIMEOUT:-240}" bash -c '
        set -eo pipefail
        ctl="$0/tools/batonctl"
        model="${TMPDIR:-/tmp}/baton-gpu-checks-small"  # ~250 MB: kept out of $OUT
        "$ctl" make-model --preset small --seed 1 --out "$model"
        tokens=$(seq 0 499 | awk "{printf \"%s%d\", (NR > 1 ? \",\" : \"\"), (\$1 * 37 + 11) % 4096}")
        args=(forward --model "$model" --tokens "$tokens" --mode compact --keep 134
              --chunk-size 128 --valid-start 64 --decode 8 --json)
        for dev in cpu cuda; do
          start=$(date +%s%N)
          "$ctl" "${args[@]}" --device "$dev" >"$OUT/forward_$dev.json"
          echo "$dev: $(( ($(date +%s%N) - start) / 1000000 )) ms (load, prefill, decode)"
        done
        ${PYTHON:-python3} - "$OUT/forward_cpu.json" "$OUT/forward_cuda.json" <<"PY" | tee "$OUT/forward_compare.txt"
import json, sys
cpu, gpu = (json.load(open(p)) for p in sys.argv[1:3])
worst = 0.0
for a, b in zip(gpu["logits"], cpu["logits"]):
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)) / max(1e-12, max(abs(y) for y in b)))
ok = (cpu["positions"] == gpu["positions"] and cpu["tokens"] == gpu["tokens"]
      and len(cpu["logits"]) == len(gpu["logits"]) and worst <= 1e-3)
print("rows", len(cpu["positions"]), "tokens cpu", cpu["tokens"], "cuda", gpu["tokens"])
print("worst relative logit error %.3g" % worst, "OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY' "$build"
      ;;
    bench)
      step bench "${BENCH_TIMEOUT:-570}" "$root/bench/run_gpu_bench.sh"
      ;;
    torchcheck)
      # Which PyTorch the peer used (or why it could not run).
      step torchcheck 60 bash -c 'cat "$OUT"/torch_gpu*.err 2>/dev/null; ls -l "$OUT"'
      ;;
    *)
      echo "unknown step '$s' (allowed: env configure build test modeltest forward bench torchcheck)" >&2
      exit 2
      ;;
  esac
done
echo "summary ($OUT/summary.txt):"
cat "$OUT/summary.txt"
exit "$failed"
