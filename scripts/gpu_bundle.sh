#!/usr/bin/env bash
# Packs the GPU bundle: everything a one-shot run on a bare GPU machine needs from this build
# machine, in one xz-compressed file that the device tool carries with the working tree. That
# machine has the CUDA toolkit (cudart, cuBLAS), the C and C++ runtimes and PyTorch, but none of
# the Debian libraries baton links (gRPC, protobuf, RocksDB, Abseil, OpenBLAS, ...) and no
# registry to install them from, so the bundle brings them.
#
#   scripts/gpu_bundle.sh             configure and build build-bundle (Release, CUDA for
#                                     sm_90a machine code plus compute_90 PTX), then pack
#   scripts/gpu_bundle.sh --no-build  pack the build in BATON_BUILD_DIR as it is
#
# The bundle, baton-gpu/ inside the archive:
#   bin/       backend_ops_test, cuda_consistency_test, engine_backends_test, batonctl,
#              baton_gpu_bench (stripped) and libbaton_backend_cuda.so, which the engine and
#              backend_ops_test load from beside their executable
#   lib/       every shared library those load except the ones the GPU machine has: the C
#              runtime (libc, libm, libpthread, libdl, librt, the loader), libstdc++ and
#              libgcc_s, and the CUDA runtime, cuBLAS and the driver
#   fallback/  this machine's libstdc++ and libgcc_s, for a GPU machine whose own are older
#              (bench/run_gpu_checks.sh adds them only when ldd says a version is missing)
#   MANIFEST   the commit, the CUDA targets, nvcc's version, and every file's sha256
# Environment: BATON_BUILD_DIR (default build-bundle), BUNDLE (the archive to write, default
# gpu-bundle/baton-gpu.tar.xz), CUDA_ARCHITECTURES (default "90a-real;90-virtual"),
# XZ_LEVEL (default 6), BATON_JOBS (default 2).
# scripts/check_gpu_bundle.sh proves a bundle on this machine; bench/run_gpu_checks.sh runs it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build-bundle}"
bundle="${BUNDLE:-$root/gpu-bundle/baton-gpu.tar.xz}"
archs="${CUDA_ARCHITECTURES:-90a-real;90-virtual}"
build_first=1
for arg in "$@"; do
  case "$arg" in
    --no-build) build_first=0 ;;
    *)
      echo "gpu_bundle: unknown argument '$arg' (allowed: --no-build)" >&2
      exit 2
      ;;
  esac
done

executables=(tests/kernels/backend_ops_test tests/kernels/cuda_consistency_test
             tests/model/engine_backends_test tools/batonctl bench/baton_gpu_bench)
backend=model/cuda/libbaton_backend_cuda.so

if ((build_first)); then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_WITH_CUDA=ON \
    "-DCMAKE_CUDA_ARCHITECTURES=$archs"
  cmake --build "$build" -j "${BATON_JOBS:-2}" --target baton_backend_cuda \
    backend_ops_test cuda_consistency_test engine_backends_test batonctl baton_gpu_bench
fi
for f in "${executables[@]}" "$backend"; do
  if [[ ! -f "$build/$f" ]]; then
    echo "gpu_bundle: $build/$f is missing: build it with CUDA first (or drop --no-build)" >&2
    exit 1
  fi
done

stage="$(mktemp -d "${TMPDIR:-/tmp}/baton-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
top="$stage/baton-gpu"
mkdir -p "$top/bin" "$top/lib" "$top/fallback"
for f in "${executables[@]}" "$backend"; do
  install -m 0755 "$build/$f" "$top/bin/"
  strip --strip-unneeded "$top/bin/$(basename "$f")"
done

# What the GPU machine provides: matched on the library's soname.
provided='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libcuda\.so)'
missing=0
declare -A copied=()
for f in "$top"/bin/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    if [[ "$path" == "not" ]]; then
      echo "gpu_bundle: $(basename "$f") needs $name, which this machine lacks" >&2
      missing=1
      continue
    fi
    [[ "$name" =~ $provided ]] && continue
    [[ -n "${copied[$name]:-}" ]] && continue
    cp -L "$path" "$top/lib/$name"
    copied[$name]=1
  done < <(ldd "$f")
done
((missing == 0)) || exit 1
fallback_from=()
for lib in libstdc++.so.6 libgcc_s.so.1; do
  source_path="$(readlink -f "$(ldconfig -p | awk -v n="$lib" '$1 == n && /x86-64/ {print $NF; exit}')")"
  cp "$source_path" "$top/fallback/$lib"
  fallback_from+=("$(basename "$source_path")")
done

{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
    "$(git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo '(with uncommitted changes)')"
  echo "build $build ($(awk -F= '/^CMAKE_BUILD_TYPE:/ {print $2}' "$build/CMakeCache.txt"))"
  echo "cuda_architectures $(awk -F= '/^CMAKE_CUDA_ARCHITECTURES:/ {print $2}' "$build/CMakeCache.txt")"
  echo "nvcc $(awk -F= '/^CMAKE_CUDA_COMPILER:/ {print $2}' "$build/CMakeCache.txt" | xargs -r -I{} {} --version | tail -2 | head -1)"
  echo "glibc $(ldd --version | head -1 | awk '{print $NF}'); fallback from ${fallback_from[*]}"
  (cd "$top" && find bin lib fallback -type f | sort | xargs sha256sum)
} >"$top/MANIFEST"

mkdir -p "$(dirname "$bundle")"
tar -C "$stage" -cf - baton-gpu | xz -T "${BATON_JOBS:-2}" "-${XZ_LEVEL:-6}" >"$bundle.tmp"
mv "$bundle.tmp" "$bundle"
echo "gpu_bundle: $bundle ($(du -h "$bundle" | cut -f1); $(ls "$top/lib" | wc -l) libraries," \
  "unpacked $(du -sh "$top" | cut -f1))"
