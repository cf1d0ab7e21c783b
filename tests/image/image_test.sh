#!/usr/bin/env bash
# The container image, built and run as the chart runs it (ctest image_chart_run, label
# extended): builds the Dockerfile's cpu target offline with scripts/build_image.sh from
# BUILD_DIR's binaries (--from-build), then starts the chart's default pods as containers of the
# image (tests/helm/chart_run_test.sh with CHART_RUN_IMAGE): the router, store, prefill and
# decode containers each SERVING on their health ports, and the chart's helm test pod generating
# text through the router with the builtin model.
#
#   tests/image/image_test.sh BUILD_DIR [VALUES.yaml...]   (default: the chart's defaults)
#
# Starts dockerd (--bridge=none --iptables=false) when no engine runs, and stops it at the end.
# Without Docker, debootstrap or a way to install them (root and Debian's mirror), it exits
# $BATON_SKIP_CODE (ctest: 77, skipped).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "$1" && pwd)"
shift
skip_code="${BATON_SKIP_CODE:-0}"
tag="baton:image-test"

if [[ ! -x /usr/sbin/dockerd || ! -x /usr/sbin/debootstrap ]]; then
  if [[ "$(id -u)" != 0 ]] || ! DEBIAN_FRONTEND=noninteractive apt-get install -y \
    --no-install-recommends docker.io debootstrap >/dev/null 2>&1; then
    echo "SKIP: needs Docker (docker.io) and debootstrap, or root to install them"
    exit "$skip_code"
  fi
fi
source "$root/scripts/dockerd.sh"
trap stop_dockerd EXIT
if ! ensure_dockerd "${TMPDIR:-/tmp}/image-test-dockerd.log"; then
  echo "FAIL: dockerd did not start: $(tail -5 "${TMPDIR:-/tmp}/image-test-dockerd.log")"
  exit 1
fi

if ! bash "$root/scripts/build_image.sh" --from-build "$build" --tag "$tag" \
  >"${TMPDIR:-/tmp}/image-test-build.log" 2>&1; then
  echo "FAIL: the image did not build: $(tail -20 "${TMPDIR:-/tmp}/image-test-build.log")"
  exit 1
fi
tail -2 "${TMPDIR:-/tmp}/image-test-build.log"
# The image runs as the chart says its pods do: user 10001, and nothing else.
user="$("$docker" image inspect -f '{{.Config.User}}' "$tag")"
if [[ "$user" != "10001:10001" ]]; then
  echo "FAIL: the image's user is '$user', not 10001:10001 (the chart's runAsUser)"
  exit 1
fi
if (($# == 0)); then set -- ""; fi
CHART_RUN_IMAGE="$tag" bash "$root/tests/helm/chart_run_test.sh" "$build" "$@"
