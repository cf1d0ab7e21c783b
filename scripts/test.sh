#!/usr/bin/env bash
# Runs baton's test suite: every ctest suite (unit, CLI, multi-process e2e, the network-
# namespace fault tests and the Helm chart test) in build/, then the sanitizer and fuzzing pass
# (scripts/sanitize.sh: in-process suites under ASan + UBSan, each libFuzzer target for
# FUZZ_SECONDS). Exits non-zero on any failure.
#
#   scripts/test.sh          what CI runs: everything except the suites labelled "extended"
#   scripts/test.sh --all    everything, the "extended" suites too (the 2,000-request soak)
#   scripts/test.sh ARGS...  only ctest with ARGS (no sanitizer pass), e.g. -L unit
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BATON_BUILD_DIR:-$root/build}"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "test: no build in $build_dir; run scripts/setup.sh first" >&2
  exit 1
fi
cmake --build "$build_dir" -j "${BATON_JOBS:-2}"
# ctest starts the tests it knows to be long first, so that they run beside the short ones
# instead of after them; a fresh build knows none, so it starts from the costs this tree
# records (tests/ctest_costs/, measured on a CI machine; ctest keeps its own from then on).
seed_test_costs() {
  local costs="$1/Testing/Temporary/CTestCostData.txt"
  if [[ ! -f "$costs" ]]; then
    mkdir -p "$(dirname "$costs")"
    cp "$2" "$costs"
  fi
}
seed_test_costs "$build_dir" "$root/tests/ctest_costs/gcc.txt"
# A failed test's output is printed where it ends, among hundreds of others; it is printed again
# at the very end (its last lines), where a CI log's tail shows it.
repeat_failures() {
  local log="$build_dir/Testing/Temporary/LastTest.log"
  local failed="$build_dir/Testing/Temporary/LastTestsFailed.log"
  [[ -f "$log" && -f "$failed" ]] || return 0
  echo "=== the failed tests' last output lines (all of it above and in $log) ==="
  local name
  while IFS=: read -r _ name; do
    echo "--- $name"
    awk -v name="$name" '$0 ~ "^[0-9]+/[0-9]+ Test: " && substr($0, index($0, "Test: ") + 6) == name {on = 1; next}
      on && /^<end of output>/ {exit} on' "$log" | tail -n 40
  done <"$failed"
}
ctest_run() {
  ctest --test-dir "$build_dir" --output-on-failure -j "${BATON_JOBS:-2}" "$@" && return 0
  local status=$?
  repeat_failures
  return "$status"
}
if (($# == 0)); then
  ctest_run -LE extended
  bash "$root/scripts/sanitize.sh"
elif [[ "$1" == "--all" && $# -eq 1 ]]; then
  ctest_run
  bash "$root/scripts/sanitize.sh"
else
  ctest_run "$@"
fi
