#!/usr/bin/env bash
# The GPU bundle's scripts on a machine without a GPU (ctest gpu_bundle): packs a bundle from
# this build (scripts/gpu_bundle.sh --no-build), proves it in a bare chroot
# (scripts/check_gpu_bundle.sh), checks that the proof catches a bundle missing a library, and
# runs the device driver's CPU-side steps from it (bench/run_gpu_checks.sh with ALLOW_SKIPS=1):
# what comes back is exactly summary.txt, gpu_bench_table.txt and gpu-logs.tar.xz, every test
# ran in its own process and passed or skipped, and the forward step fails naming the missing
# device.
#
#   gpu_bundle_test.sh BUILD_DIR      exits 77 (skipped) without root or unshare
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(readlink -f "$1")"
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null || ! command -v xz >/dev/null; then
  echo "SKIPPED: needs root, unshare and xz (a chroot in a private mount namespace)"
  exit 77
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/baton-bundle-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

BATON_BUILD_DIR="$build" BUNDLE="$tmp/bundle.tar.xz" XZ_LEVEL=1 \
  bash "$root/scripts/gpu_bundle.sh" --no-build || fail "gpu_bundle.sh"
xz -dc "$tmp/bundle.tar.xz" >"$tmp/bundle.tar"
contents="$(tar -tf "$tmp/bundle.tar")"
grep -q '^baton-gpu/lib/libgrpc++' <<<"$contents" || fail "the bundle lacks gRPC"
grep -qE '^baton-gpu/lib/(libc|libstdc\+\+|libcudart|libcublas)\.so' <<<"$contents" &&
  fail "the bundle carries a library the GPU machine has"
BATON_BUILD_DIR="$build" bash "$root/scripts/check_gpu_bundle.sh" "$tmp/bundle.tar.xz" ||
  fail "check_gpu_bundle.sh on the bundle"

# A bundle without OpenBLAS must fail the proof (left uncompressed: the proof reads either).
cp "$tmp/bundle.tar" "$tmp/broken.tar"
tar --delete -f "$tmp/broken.tar" baton-gpu/lib/libopenblas.so.0
if bash "$root/scripts/check_gpu_bundle.sh" "$tmp/broken.tar" >"$tmp/broken.log" 2>&1; then
  fail "check_gpu_bundle.sh passed a bundle without libopenblas"
fi
grep -q "FAILED  loader finds every library of batonctl" "$tmp/broken.log" ||
  fail "the proof did not name batonctl's missing library: $(cat "$tmp/broken.log")"

# The driver's CPU-side steps from the bundle, its test step on a few tests of each binary (a
# test process costs half a second of CUDA runtime start here): TESTS picks them, and exactly
# those run, each in its own process. (XZ_OPT=-1: the log tarball holds the forward step's
# logits, which xz's default level takes 20 s to pack on two cores.)
tests='@(*GemmFp32_7x33x17_Strided_on_cuda|*RmsNorm_on_cuda|*.GemmBf16AccumulatesInFp32|*.NamesAreChecked|*.BatchedDecodeMatchesTheCpu|*.ReplayOnDecodeMatchesTheCpu)'
OUT="$tmp/out" WORK="$tmp/work" BUNDLE="$tmp/bundle.tar.xz" ALLOW_SKIPS=1 TESTS="$tests" XZ_OPT=-1 \
  STEPS="unpack ldd test forward" bash "$root/bench/run_gpu_checks.sh" >"$tmp/driver.log" 2>&1
status=$?
[[ $status -ne 0 ]] || fail "the driver passed without a GPU (the forward step must fail)"
[[ "$(ls "$tmp/out" | sort | tr '\n' ' ')" == "gpu-logs.tar.xz gpu_bench_table.txt summary.txt " ]] ||
  fail "\$OUT holds: $(ls "$tmp/out")"
summary="$tmp/out/summary.txt"
grep -qE '^unpack +ok' "$summary" || fail "unpack: $(cat "$summary")"
grep -qE '^ldd +ok' "$summary" || fail "ldd: $(cat "$summary")"
grep -qE '^forward +FAILED' "$summary" || fail "forward did not fail without a device"
grep -q "no CUDA device" "$summary" || fail "the forward failure does not name the missing device"
# The tests TESTS selects from each binary's list (`Suite.` lines, then `  Test` lines).
selected() {
  local suite="" line n=0
  while IFS= read -r line; do
    if [[ "$line" =~ ^([A-Za-z0-9_/]+)\.$ ]]; then
      suite="${BASH_REMATCH[1]}"
    elif [[ "$line" =~ ^\ \ ([A-Za-z0-9_/]+) && "$suite.${BASH_REMATCH[1]}" == $tests ]]; then
      n=$((n + 1))
    fi
  done < <("$@" --gtest_list_tests)
  echo "$n"
}
listed=$(selected "$build/tests/kernels/backend_ops_test" --gtest_filter='*_on_cuda')
per_binary="$listed"
for binary in kernels/cuda_consistency_test model/engine_backends_test; do
  n=$(selected "$build/tests/$binary")
  per_binary+=" $n"
  listed=$((listed + n))
done
[[ " $per_binary " != *" 0 "* ]] || fail "TESTS selects no test of some binary ($per_binary)"
ran=$(grep -cE '^  [A-Za-z0-9_/]+Test\.[A-Za-z0-9_/]+ +(SKIPPED|ok) ' "$summary")
skipped=$(grep -cE '^  [A-Za-z0-9_/]+Test\.[A-Za-z0-9_/]+ +SKIPPED ' "$summary")
[[ $ran -eq $listed && $skipped -gt 0 ]] ||
  fail "$ran tests passed or skipped ($skipped skipped) in the summary, $listed listed"
logged=$(tar -tJf "$tmp/out/gpu-logs.tar.xz" | grep -c '^logs/tests/.*\.log$')
[[ $logged -eq $listed ]] || fail "the log tarball has $logged test logs for $listed tests"
echo "ok: bundle $(du -h "$tmp/bundle.tar.xz" | cut -f1), the $listed tests TESTS selects one process each"
