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
contents="$(tar -tJf "$tmp/bundle.tar.xz")"
grep -q '^baton-gpu/lib/libgrpc++' <<<"$contents" || fail "the bundle lacks gRPC"
grep -qE '^baton-gpu/lib/(libc|libstdc\+\+|libcudart|libcublas)\.so' <<<"$contents" &&
  fail "the bundle carries a library the GPU machine has"
BATON_BUILD_DIR="$build" bash "$root/scripts/check_gpu_bundle.sh" "$tmp/bundle.tar.xz" ||
  fail "check_gpu_bundle.sh on the bundle"

# A bundle without OpenBLAS must fail the proof.
mkdir "$tmp/broken"
tar -C "$tmp/broken" -xJf "$tmp/bundle.tar.xz"
rm "$tmp/broken/baton-gpu/lib/libopenblas.so.0"
XZ_OPT=-0 tar -C "$tmp/broken" -cJf "$tmp/broken.tar.xz" baton-gpu
if bash "$root/scripts/check_gpu_bundle.sh" "$tmp/broken.tar.xz" >"$tmp/broken.log" 2>&1; then
  fail "check_gpu_bundle.sh passed a bundle without libopenblas"
fi
grep -q "FAILED  loader finds every library of batonctl" "$tmp/broken.log" ||
  fail "the proof did not name batonctl's missing library: $(cat "$tmp/broken.log")"

# The driver's CPU-side steps from the bundle.
OUT="$tmp/out" WORK="$tmp/work" BUNDLE="$tmp/bundle.tar.xz" ALLOW_SKIPS=1 \
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
listed=$("$build/tests/kernels/backend_ops_test" --gtest_list_tests --gtest_filter='*_on_cuda' |
  grep -c '^  ')
listed=$((listed + $("$build/tests/kernels/cuda_consistency_test" --gtest_list_tests | grep -c '^  ')))
listed=$((listed + $("$build/tests/model/engine_backends_test" --gtest_list_tests | grep -c '^  ')))
ran=$(grep -cE '^  [A-Za-z0-9_/]+Test\.[A-Za-z0-9_/]+ +(SKIPPED|ok) ' "$summary")
skipped=$(grep -cE '^  [A-Za-z0-9_/]+Test\.[A-Za-z0-9_/]+ +SKIPPED ' "$summary")
[[ $ran -eq $listed && $skipped -gt 0 ]] ||
  fail "$ran tests passed or skipped ($skipped skipped) in the summary, $listed listed"
logged=$(tar -tJf "$tmp/out/gpu-logs.tar.xz" | grep -c '^logs/tests/.*\.log$')
[[ $logged -eq $listed ]] || fail "the log tarball has $logged test logs for $listed tests"
echo "ok: bundle $(du -h "$tmp/bundle.tar.xz" | cut -f1), $listed tests one process each"
