#!/usr/bin/env bash
# Proves a GPU bundle (scripts/gpu_bundle.sh) on this machine, without a GPU: unpacks it into a
# bare root that holds only what the GPU machine is known to have (the C runtime, libstdc++,
# libgcc_s, the CUDA runtime and cuBLAS) and runs every step of bench/run_gpu_checks.sh that
# needs no GPU there, chrooted, with a clean environment and only the bundle's libraries on
# LD_LIBRARY_PATH. Nothing of this machine's /usr/lib is visible, so a library the bundle
# forgot fails here as it would there.
#
#   scripts/check_gpu_bundle.sh [BUNDLE]     (default gpu-bundle/baton-gpu.tar.xz; needs root)
# Checks, each printed as "ok ..." or "FAILED ...":
#   - the loader finds every library of every binary (ld.so --list: nothing "not found");
#   - batonctl makes the tiny model and runs `forward --device cpu`, with the same JSON as this
#     machine's build gives (BATON_BUILD_DIR, default build, when it has batonctl);
#   - the test binaries start and pass, skipping the tests that need a GPU with the reason
#     (backend_ops_test only its cases on cuda, as the GPU run takes them; engine_backends_test's
#     reason shows that the CUDA backend library and cudart loaded);
#   - baton_gpu_bench starts and refuses to run without a device (exit 2).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="$(readlink -f "${1:-$root/gpu-bundle/baton-gpu.tar.xz}")"
build="${BATON_BUILD_DIR:-$root/build}"
if [[ ! -f "$bundle" ]]; then
  echo "check_gpu_bundle: no bundle at $bundle (make one with scripts/gpu_bundle.sh)" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "check_gpu_bundle: needs root (chroot and a private mount namespace)" >&2
  exit 2
fi

jail="$(mktemp -d "${TMPDIR:-/tmp}/baton-bundle-root.XXXXXX")"
cleanup() {
  umount -l "$jail/proc" "$jail/dev" 2>/dev/null
  rm -rf "$jail"
}
trap cleanup EXIT

# The GPU machine's share: the loader and the C and C++ runtimes (glibc's libraries that
# gpu_bundle.sh takes as provided, libresolv among them) at the loader's default paths, the
# CUDA runtime and cuBLAS where the toolkit keeps them.
mkdir -p "$jail/lib64" "$jail/lib/x86_64-linux-gnu" "$jail/usr/local/cuda/lib64" "$jail/tmp" \
  "$jail/proc" "$jail/dev" "$jail/opt"
chmod 1777 "$jail/tmp"
cp -L /lib64/ld-linux-x86-64.so.2 "$jail/lib64/"
for lib in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 \
  libstdc++.so.6 libgcc_s.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$jail/lib/x86_64-linux-gnu/"
done
cuda_lib="$(dirname "$(readlink -f "$(ldconfig -p | awk '$1 == "libcudart.so.13" {print $NF; exit}')" 2>/dev/null)" 2>/dev/null)"
for dir in "$cuda_lib" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  if [[ -n "$dir" && -f "$dir/libcudart.so.13" ]]; then cuda_lib="$dir"; break; fi
done
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  cp -L "$cuda_lib/$lib" "$jail/usr/local/cuda/lib64/"
done
tar -C "$jail/opt" -xf "$bundle"  # xz, or uncompressed (tar tells them apart)
top=/opt/baton-gpu

failed=0
report() {  # report STATUS WHAT
  if [[ "$1" -eq 0 ]]; then echo "ok      $2"; else echo "FAILED  $2"; failed=1; fi
}
# in_jail COMMAND...: runs COMMAND chrooted, with a clean environment.
in_jail() {
  unshare --mount --fork bash -c '
    jail="$1"; shift
    mount -t proc proc "$jail/proc" && mount --bind /dev "$jail/dev" || exit 97
    exec chroot "$jail" /usr/bin/env -i HOME=/tmp TMPDIR=/tmp OMP_NUM_THREADS=2 \
      LD_LIBRARY_PATH='"$top"'/lib:/usr/local/cuda/lib64 "$@"' _ "$jail" "$@"
}
# The chroot has no shell of its own: env is the one program it needs besides the bundle.
mkdir -p "$jail/usr/bin"
cp /usr/bin/env "$jail/usr/bin/env"

for f in "$jail$top"/bin/*; do
  listing="$(in_jail /lib64/ld-linux-x86-64.so.2 --list "$top/bin/$(basename "$f")" 2>&1)"
  status=$?
  [[ $status -eq 0 ]] && ! grep -q "not found" <<<"$listing" && grep -q "=>" <<<"$listing"
  report $? "loader finds every library of $(basename "$f") ($(grep -c '=>' <<<"$listing") listed)"
  grep -E "not found|error while" <<<"$listing" | sed 's/^/        /'
done

tokens="$(seq 0 79 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 512}')"
forward=(forward --model /tmp/tiny --tokens "$tokens" --mode compact --keep 40 --chunk-size 32
         --decode 4 --device cpu --json)
in_jail "$top/bin/batonctl" make-model --preset tiny --seed 3 --out /tmp/tiny >/dev/null 2>&1
report $? "batonctl make-model --preset tiny"
in_jail "$top/bin/batonctl" "${forward[@]}" >"$jail/tmp/forward_bundle.json" 2>"$jail/tmp/forward.err"
status=$?
[[ $status -eq 0 ]] && grep -q '"logits"' "$jail/tmp/forward_bundle.json"
report $? "batonctl forward --device cpu (status $status)"
if [[ -x "$build/tools/batonctl" ]]; then
  here="$(mktemp -d "${TMPDIR:-/tmp}/baton-bundle-here.XXXXXX")"
  "$build/tools/batonctl" make-model --preset tiny --seed 3 --out "$here/tiny" >/dev/null &&
    "$build/tools/batonctl" "${forward[@]/\/tmp\/tiny/$here/tiny}" >"$here/forward.json"
  cmp -s "$here/forward.json" "$jail/tmp/forward_bundle.json"
  report $? "the bundle's forward JSON equals $build's"
  rm -rf "$here"
fi

for t in backend_ops_test cuda_consistency_test engine_backends_test; do
  filter='*'
  [[ $t == backend_ops_test ]] && filter='*_on_cuda'
  in_jail "$top/bin/$t" --gtest_filter="$filter" >"$jail/tmp/$t.log" 2>&1
  status=$?
  listed=$(grep -c '^\[ RUN' "$jail/tmp/$t.log")
  skipped=$(grep -c '^\[  SKIPPED \]' "$jail/tmp/$t.log")
  [[ $status -eq 0 && $listed -gt 0 && $skipped -gt 0 ]] && ! grep -q '^\[  FAILED' "$jail/tmp/$t.log"
  report $? "$t starts and skips without a GPU ($listed run, $skipped skip lines, status $status)"
done
grep -m1 -q "no CUDA device" "$jail/tmp/engine_backends_test.log"
report $? "engine_backends_test loaded the CUDA backend and cudart (its skip names no device: $(grep -m1 -o 'no CUDA device[^;]*' "$jail/tmp/engine_backends_test.log"))"

in_jail "$top/bin/baton_gpu_bench" --presets small >/dev/null 2>"$jail/tmp/bench.err"
status=$?
[[ $status -eq 2 ]] && grep -q "no CUDA device" "$jail/tmp/bench.err"
report $? "baton_gpu_bench starts and refuses without a device (status $status)"

if ((failed)); then
  echo "check_gpu_bundle: FAILED ($bundle)"
  exit 1
fi
echo "check_gpu_bundle: ok ($bundle, $(du -h "$bundle" | cut -f1))"
