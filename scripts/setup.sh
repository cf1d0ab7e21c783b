#!/usr/bin/env bash
# One-command set-up: installs the Debian 12 packages baton needs (as root, idempotent) and
# builds everything into build/. Run from anywhere; re-running only rebuilds what changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BATON_BUILD_DIR:-$root/build}"

packages=(
  build-essential cmake ninja-build pkg-config git
  ccache  # compiler output reused between builds and clones on one machine (CMakeLists.txt)
  lld  # the linker of every executable (CMakeLists.txt): links several times faster than ld
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  librocksdb-dev libucx-dev ucx-utils libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libopenblas-openmp-dev libssl-dev libspdlog-dev
  prometheus-cpp-dev libxxhash-dev libyaml-cpp-dev
  libcurl4-openssl-dev
  gnuplot-nox  # batonctl report draws its PNG plots with it
  clang-14 libclang-rt-14-dev  # scripts/sanitize.sh: ASan, UBSan and libFuzzer
  openssl  # the Helm chart test makes a throwaway PKI with it
  libsentencepiece-dev sentencepiece  # the tokenizer, and spm_train for the default model's
  libboost1.81-dev  # Boost.Beast: the router's OpenAI-compatible HTTP front
  libcpp-httplib-dev  # the loopback server of batonctl fetch-model's test
  curl  # the HTTP tests drive the API with curl, as users do
  python3-jinja2  # the chat template test renders every template through Jinja2 beside baton
  prometheus  # promtool and a Prometheus for tests/observability (its service is not started)
  universal-ctags  # scripts/function_lengths.sh finds each function's extent with it
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  # Installing must start no service (prometheus's would serve on :9090, and its init script
  # can fail the install where there is no systemd): a policy-rc.d that denies every start,
  # for this install only, unless the machine has one of its own.
  # On a systemd machine the prometheus unit is still enabled for the next boot; `systemctl
  # disable prometheus` if that is not wanted.
  policy=/usr/sbin/policy-rc.d
  own_policy=false
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
    "${sudo_cmd[@]}" chmod 755 "$policy"
    own_policy=true
    trap '"${sudo_cmd[@]}" rm -f "$policy"' EXIT
  fi
  "${sudo_cmd[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends \
    "${missing[@]}"
  if "$own_policy"; then
    "${sudo_cmd[@]}" rm -f "$policy"
    trap - EXIT
  fi
else
  echo "setup: all ${#packages[@]} Debian packages present"
fi

# Node.js and npm fetch the default tokenizer's corpus and the official openai client the
# HTTP tests drive; Debian's packages unless the machine already has a Node.js of its own.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends \
    nodejs npm
fi
# The default model's tokenizer (`baton up` serves it), trained on the Brown corpus, and the
# tests' npm packages.
bash "$root/scripts/build_tokenizer.sh" "$build_dir/tokenizer"
bash "$root/scripts/install_npm_deps.sh" "$build_dir"

cmake -G Ninja -S "$root" -B "$build_dir" \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  -DBATON_WITH_CUDA="${BATON_WITH_CUDA:-AUTO}"
cmake --build "$build_dir" -j "${BATON_JOBS:-2}"
echo "setup: built into $build_dir"
