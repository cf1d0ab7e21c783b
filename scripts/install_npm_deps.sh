#!/usr/bin/env bash
# Installs the Node packages of tests/http (the official openai client that
# tests/http/openai_client.js drives baton's HTTP API with) into BUILD_DIR/npm, so no
# node_modules ever lands in the source tree. The committed package-lock.json pins every
# package and its integrity hash, and `npm ci` installs exactly that.
#
#   scripts/install_npm_deps.sh BUILD_DIR
#
# Skips the install when BUILD_DIR/npm/node_modules/openai exists and was installed from a
# lockfile with the same sha256 (recorded in BUILD_DIR/npm/lockfile.sha256). Run the client
# with BATON_NPM_DIR=BUILD_DIR/npm.
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm_dir="$1/npm"
lockfile="$root/tests/http/package-lock.json"
stamp_file="$npm_dir/lockfile.sha256"
lock_hash="$(sha256sum "$lockfile" | cut -d' ' -f1)"

if [[ -d "$npm_dir/node_modules/openai" && -f "$stamp_file" &&
  "$(cat "$stamp_file")" == "$lock_hash" ]]; then
  echo "install_npm_deps: $npm_dir is up to date with tests/http/package-lock.json"
  exit 0
fi

mkdir -p "$npm_dir"
cp "$root/tests/http/package.json" "$lockfile" "$npm_dir/"
# The stamp goes only after a successful install, so a failed one is retried next time.
rm -f "$stamp_file"
(cd "$npm_dir" && npm ci --no-audit --no-fund)
echo "$lock_hash" >"$stamp_file"
echo "install_npm_deps: installed tests/http's packages into $npm_dir"
