#!/usr/bin/env bash
# Runs baton's whole test suite: every ctest suite (unit, CLI, multi-process e2e and the Helm
# chart test) in build/, then the sanitizer and fuzzing pass (scripts/sanitize.sh: in-process
# suites under ASan + UBSan, each libFuzzer target for FUZZ_SECONDS). Exits non-zero on any
# failure. Extra arguments go to ctest and skip the sanitizer pass, e.g. `scripts/test.sh -L unit`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BATON_BUILD_DIR:-$root/build}"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "test: no build in $build_dir; run scripts/setup.sh first" >&2
  exit 1
fi
cmake --build "$build_dir" -j "${BATON_JOBS:-2}"
ctest --test-dir "$build_dir" --output-on-failure -j "${BATON_JOBS:-2}" "$@"
if (($# == 0)); then
  bash "$root/scripts/sanitize.sh"
fi
