#!/usr/bin/env bash
# The sanitizer and fuzzing pass (part of CI): builds baton with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer into build-sanitize/, runs every in-process test suite there
# (any sanitizer report fails it; the reference comparisons in every mode, of the trained
# models and of EngineTest's, are left to the plain build, SANITIZE_ALL=1 keeps them: their code
# is what the other EngineTest and model suites run here, at a tenth of the cost), then runs each libFuzzer target of tests/fuzz for
# FUZZ_SECONDS (default 10; BATON_JOBS of them at a time) from its seed corpus and prints its
# executions. Exits non-zero on a failed test or a fuzzer finding (the input is kept under
# build-sanitize/fuzz/).
#
#   scripts/sanitize.sh            build, test, fuzz
#   FUZZ_SECONDS=300 scripts/sanitize.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_SANITIZE_DIR:-$root/build-sanitize}"
seconds="${FUZZ_SECONDS:-10}"

CC=clang-14 CXX=clang++-14 cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBATON_WITH_CUDA=OFF -DBATON_SANITIZE=ON -DBATON_FUZZ=ON \
  -DBATON_TOKENIZER_DIR="${BATON_BUILD_DIR:-$root/build}/tokenizer" >/dev/null
cmake --build "$build" -j "${BATON_JOBS:-2}" --target inprocess_tests fuzzers

# The costs ctest starts from in a fresh build (see scripts/test.sh).
costs="$build/Testing/Temporary/CTestCostData.txt"
if [[ ! -f "$costs" ]]; then
  mkdir -p "$(dirname "$costs")"
  cp "$root/tests/ctest_costs/sanitize.txt" "$costs"
fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
skip=()
[[ -n "${SANITIZE_ALL:-}" ]] ||
  skip=(-E '^(Models/TrainedModelTest\.|EngineTest\.(MatchesReferenceInEveryMode|KeepOfSpanRIsExactAndOneLessIsNot)$)')
ctest --test-dir "$build" --output-on-failure -j "${BATON_JOBS:-2}" -L "^(unit|model|store|node)$" \
  "${skip[@]}"

# The fuzzers run BATON_JOBS at a time (each is one process on one core), then report in order.
mkdir -p "$build/fuzz"
fuzz_one() {
  local fuzzer="$1" name corpus
  name="$(basename "$fuzzer")"
  name="${name#fuzz_}"
  corpus="$build/fuzz/$name"
  mkdir -p "$corpus"
  if "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz/$name-" "$corpus" "$root/tests/fuzz/corpus/$name" \
    >"$build/fuzz/$name.log" 2>&1; then
    echo ok >"$build/fuzz/$name.status"
  else
    echo failed >"$build/fuzz/$name.status"
  fi
}
fuzzers=("$build"/tests/fuzz/fuzz_*)
rm -f "$build"/fuzz/*.status
for fuzzer in "${fuzzers[@]}"; do
  while (($(jobs -rp | wc -l) >= ${BATON_JOBS:-2})); do wait -n || true; done
  fuzz_one "$fuzzer" &
done
wait
status=0
for fuzzer in "${fuzzers[@]}"; do
  name="$(basename "$fuzzer")"
  name="${name#fuzz_}"
  if [[ "$(cat "$build/fuzz/$name.status" 2>/dev/null)" == ok ]]; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz/$name.log")"
    echo "fuzz $name: ${runs:-?} executions in ${seconds} s, no crash"
  else
    echo "fuzz $name: FAILED (see $build/fuzz/$name.log)"
    tail -40 "$build/fuzz/$name.log"
    status=1
  fi
done
exit "$status"
