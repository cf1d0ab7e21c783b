#!/usr/bin/env bash
# The one-shot run on a lent GPU machine, from the GPU bundle (scripts/gpu_bundle.sh): that
# machine has no Debian -dev libraries and no registry, so nothing is configured or built
# there. Within about BUDGET seconds (default 420, so that one device command of 600 s holds it
# with room for the machine's start inside a 15-minute lease):
#   env       nvidia-smi, the CUDA libraries found, PyTorch's version
#   unpack    the bundle into WORK
#   ldd       every bundled binary's libraries resolve (this machine's libstdc++ and libgcc_s
#             are replaced by the bundle's fallback ones only when ldd says a version is missing)
#   test      the CUDA side of backend_ops_test (every op case on cuda), cuda_consistency_test,
#             then engine_backends_test, ONE TEST PER PROCESS (a sticky device error in one
#             test must not fail the rest); on a GPU machine a skip fails
#   forward   `batonctl forward` of the small preset on cuda against cpu: same positions and
#             tokens, logits within 1e-3 relative
#   bench     per (preset, dtype) pair, baton_gpu_bench and then the PyTorch peer on the same
#             shapes (the peer runs whether or not baton did), while time is left
# Every step goes on after a failed one. Back in $OUT (the device tool returns at most 8 files):
#   summary.txt          one line per step and per test, with status and seconds
#   gpu_bench_table.txt  baton beside PyTorch (bench/gpu_table.py)
#   gpu-logs.tar.xz      everything else: each step's and each test's log, GoogleTest JSON,
#                        the forward JSONs, the bench and peer JSONs, the bundle's MANIFEST
# Exit status 0 only when every step passed.
#
#   device run, carry ["gpu-bundle"]:  bash bench/run_gpu_checks.sh
# Environment: BUNDLE (default gpu-bundle/baton-gpu.tar.xz), OUT (default ./gpu-out), WORK
# (default $TMPDIR/baton-gpu-run), BUDGET (s), STEPS (default "env unpack ldd test forward
# bench"), TEST_TIMEOUT (s per test, default 60), PAIRS (default
# "small:bf16 large:bf16 small:fp32 large:fp32"), LENGTHS (1024,4096), BATCHES (1,8,64),
# DECODE_CONTEXT (2048), REPEATS (2), PEAK_TFLOPS (989), PYTHON (python3), TESTS (a bash
# pattern over Suite.Test names: the test step runs only those; default every test, e.g.
# TESTS='*Attention*' to run a failed kind again), ALLOW_SKIPS=1 (a skipped test passes: for
# checking the bundle on a machine without a GPU).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="${BUNDLE:-$root/gpu-bundle/baton-gpu.tar.xz}"
out="${OUT:-$PWD/gpu-out}"
work="${WORK:-${TMPDIR:-/tmp}/baton-gpu-run}"
budget="${BUDGET:-420}"
steps="${STEPS:-env unpack ldd test forward bench}"
python="${PYTHON:-python3}"
test_timeout="${TEST_TIMEOUT:-60}"
logs="$work/logs"
top="$work/baton-gpu"
rm -rf "$work"
mkdir -p "$out" "$logs/tests"
: >"$out/summary.txt"
started=$SECONDS
failed=0

left() { echo $((budget - (SECONDS - started))); }
note() { echo "$*" | tee -a "$out/summary.txt"; }
# step NAME LIMIT COMMAND...: COMMAND under timeout (LIMIT, cut to the time left), its output in
# logs/NAME.log; one summary line; never stops the script.
step() {
  local name="$1" limit="$2"
  shift 2
  local remaining
  remaining=$(left)
  ((limit > remaining)) && limit=$remaining
  if ((limit < 5)); then
    note "$(printf '%-28s %-8s %5ss' "$name" "NOT-RUN" 0)  (budget spent)"
    failed=1
    return 1
  fi
  echo "+ [$name, ${limit}s] $*" >>"$logs/commands.log"
  local begin=$SECONDS rc=0
  # A function of this script runs in a child bash (exported below), so that timeout can end it.
  declare -F "$1" >/dev/null && set -- bash -c '"$@"' _ "$@"
  timeout --kill-after=5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  local verdict=ok
  if ((rc == 124 || rc == 137)); then verdict=TIMEOUT; elif ((rc != 0)); then verdict=FAILED; fi
  ((rc == 0)) || failed=1
  note "$(printf '%-28s %-8s %5ss  rc=%s' "$name" "$verdict" $((SECONDS - begin)) "$rc")"
  ((rc == 0)) || tail -n 4 "$logs/$name.log" | sed 's/^/    | /' | tee -a "$out/summary.txt"
  return $rc
}

# The CUDA runtime and cuBLAS of this machine: the loader's cache, the toolkit, or PyTorch's
# nvidia wheels.
cuda_dirs() {
  {
    ldconfig -p 2>/dev/null | awk '/libcudart\.so\.13|libcublas\.so\.13|libcublasLt\.so\.13/ {print $NF}'
    find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local/cuda-13* /usr/lib/x86_64-linux-gnu \
      -maxdepth 4 \( -name 'libcudart.so.13*' -o -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' \) 2>/dev/null
    "$python" - 2>/dev/null <<'PY'
import glob, os, site
for base in site.getsitepackages():
    for pattern in ("nvidia/*/lib/libcu*.so.13*", "nvidia/cu13/lib/libcu*.so.13*"):
        for path in glob.glob(os.path.join(base, pattern)):
            print(path)
PY
  } | xargs -r -n1 dirname | awk '!seen[$0]++' | paste -sd: -
}

gpu_env() {
  export LD_LIBRARY_PATH="$top/lib${extra_libs:+:$extra_libs}${cuda_path:+:$cuda_path}"
}

run_env() {
  nvidia-smi || echo "nvidia-smi failed"
  echo "CUDA library folders: ${cuda_path:-none found}"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || echo "no torch"
  nproc
  uname -a
}

check_ldd() {
  local bad=0 f report
  for f in "$top"/bin/*; do
    report="$(ldd "$f" 2>&1)" || bad=1
    echo "== $(basename "$f")"
    echo "$report"
    grep -q "not found" <<<"$report" && bad=1
  done
  return $bad
}

# run_tests BINARY [FILTER]: each test (of those FILTER selects, a --gtest_filter) in its own
# process; one summary line per test.
run_tests() {
  local binary="$1" filter="${2:-*}" name list suite test log rc verdict begin
  name="$(basename "$binary")"
  if ! list="$("$binary" --gtest_list_tests --gtest_filter="$filter" 2>"$logs/tests/$name.list.err")"; then
    note "$(printf '%-28s %-8s' "$name" "FAILED")  (cannot list its tests)"
    failed=1
    return
  fi
  while IFS= read -r line; do
    if [[ "$line" =~ ^([A-Za-z0-9_/]+)\.$ ]]; then
      suite="${BASH_REMATCH[1]}"
      continue
    fi
    [[ "$line" =~ ^\ \ ([A-Za-z0-9_/]+) ]] || continue
    test="$suite.${BASH_REMATCH[1]}"
    # shellcheck disable=SC2053  # TESTS is a pattern
    [[ "$test" == ${TESTS:-*} ]] || continue
    log="$logs/tests/${test//\//_}"  # a parametrised test's name holds '/'
    local limit=$test_timeout remaining
    remaining=$(left)
    ((limit > remaining - 150)) && limit=$((remaining - 150))  # keep time for forward and bench
    if ((limit < 5)); then
      note "$(printf '  %-60s %-8s' "$test" "NOT-RUN")  (budget)"
      failed=1
      continue
    fi
    begin=$SECONDS
    rc=0
    timeout --kill-after=5 "$limit" "$binary" --gtest_filter="$test" \
      --gtest_output="json:$log.json" >"$log.log" 2>&1 || rc=$?
    verdict=ok
    if ((rc == 124 || rc == 137)); then
      verdict=TIMEOUT
    elif ((rc != 0)); then
      verdict=FAILED
    elif grep -q '^\[  SKIPPED \]' "$log.log"; then
      verdict=SKIPPED
      [[ "${ALLOW_SKIPS:-0}" == 1 ]] || rc=3
    fi
    ((rc == 0)) || failed=1
    note "$(printf '  %-60s %-8s %4ss' "$test" "$verdict" $((SECONDS - begin)))"
    if [[ "$verdict" == SKIPPED ]]; then
      grep -m1 -A1 ': Skipped$' "$log.log" | tail -n 1 | cut -c1-160 | sed 's/^/      | /' >>"$out/summary.txt"
    elif [[ "$verdict" != ok ]]; then
      grep -m4 -E 'Failure|error|Expected|Which is|Value of' "$log.log" | cut -c1-200 |
        sed 's/^/      | /' >>"$out/summary.txt"
    fi
  done <<<"$list"
}

forward_check() {
  set -eo pipefail
  local ctl="$top/bin/batonctl" model="$work/model-small" tokens dev begin
  "$ctl" make-model --preset small --seed 1 --out "$model"
  tokens=$(seq 0 499 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 4096}')
  for dev in cpu cuda; do
    begin=$(date +%s%N)
    "$ctl" forward --model "$model" --tokens "$tokens" --mode compact --keep 134 --chunk-size 128 \
      --valid-start 64 --decode 8 --json --device "$dev" >"$logs/forward_$dev.json"
    echo "$dev: $((($(date +%s%N) - begin) / 1000000)) ms (load, prefill, decode)"
  done
  "$python" - "$logs/forward_cpu.json" "$logs/forward_cuda.json" <<'PY'
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
PY
}

bench_args() {
  echo --presets "$1" --dtypes "$2" --lengths "${LENGTHS:-1024,4096}" --batches "${BATCHES:-1,8,64}" \
    --decode-context "${DECODE_CONTEXT:-2048}" --repeats "${REPEATS:-2}"
}

cuda_path=""
extra_libs=""
export -f run_env check_ldd forward_check
export top work logs python
for s in $steps; do
  case "$s" in
    env)
      export cuda_path="$(cuda_dirs)"
      step env 20 run_env
      ;;
    unpack)
      step unpack 40 tar -C "$work" -xJf "$bundle" && cp "$top/MANIFEST" "$logs/"
      ;;
    ldd)
      [[ -n "$cuda_path" ]] || cuda_path="$(cuda_dirs)"
      gpu_env
      if ! step ldd 15 check_ldd && grep -q "version .GLIBCXX\|version .GCC_" "$logs/ldd.log"; then
        note "  this machine's libstdc++/libgcc_s are older than the build's: using the bundle's"
        extra_libs="$top/fallback"
        gpu_env
        step ldd-fallback 15 check_ldd
      fi
      ;;
    test)
      gpu_env
      for t in backend_ops_test cuda_consistency_test engine_backends_test; do
        filter='*'
        [[ $t == backend_ops_test ]] && filter='*_on_cuda'  # its CPU side is CI's
        begin=$SECONDS
        note "$(printf '%-28s (one process per test)' "$t")"
        run_tests "$top/bin/$t" "$filter"
        note "$(printf '%-28s %-8s %5ss' "$t" "done" $((SECONDS - begin)))"
      done
      ;;
    forward)
      gpu_env
      step forward 75 forward_check
      ;;
    bench)
      gpu_env
      for pair in ${PAIRS:-small:bf16 large:bf16 small:fp32 large:fp32}; do
        preset="${pair%%:*}" dtype="${pair##*:}"
        # shellcheck disable=SC2046
        step "bench-$preset-$dtype" 90 bash -c '"$@" --json >"'"$logs/baton_gpu_$preset-$dtype.json"'"' _ \
          "$top/bin/baton_gpu_bench" $(bench_args "$preset" "$dtype")
        # shellcheck disable=SC2046
        step "torch-$preset-$dtype" 90 bash -c '"$@" >"'"$logs/torch_gpu_$preset-$dtype.json"'"' _ \
          "$python" "$root/bench/torch_gpu_peer.py" $(bench_args "$preset" "$dtype")
      done
      ;;
    *)
      echo "unknown step '$s' (allowed: env unpack ldd test forward bench)" >&2
      exit 2
      ;;
  esac
done

shopt -s nullglob
baton_json=("$logs"/baton_gpu_*.json)
torch_json=("$logs"/torch_gpu_*.json)
if ((${#baton_json[@]} + ${#torch_json[@]} > 0)); then
  "$python" "$root/bench/gpu_table.py" --baton "${baton_json[@]}" --torch "${torch_json[@]}" \
    --peak-tflops "${PEAK_TFLOPS:-989}" >"$out/gpu_bench_table.txt" 2>&1
else
  echo "no bench figures (bench step not run)" >"$out/gpu_bench_table.txt"
fi
note "total $((SECONDS - started))s of a ${budget}s budget; $([[ $failed == 0 ]] && echo "every step passed" || echo "SOME STEPS FAILED")"
cp "$out/summary.txt" "$logs/"
tar -C "$work" -cJf "$out/gpu-logs.tar.xz" logs
cat "$out/summary.txt"
echo "---- gpu_bench_table.txt"
cat "$out/gpu_bench_table.txt"
exit $failed
