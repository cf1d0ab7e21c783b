#!/usr/bin/env bash
# Figures of the API's defences (issue 48), with the attacks the audit ran, on loopback:
# - gRPC: 16 concurrent 60 MiB Generate calls without a valid key against a router with API
#   keys (the builtin tiny preset's config: 131,072 positions); the calls' outcomes, the
#   router's peak RSS over its baseline and its CPU;
# - HTTP: 32 keyless connections declaring 8 MiB bodies, then 7 keyed requests, through
#   `baton up` (bench/http_body_attack.py).
# BEFORE_BUILD_DIR=<another build> runs the same against that build first (its baton-router
# and baton; build an older commit as bench/run_load_bench.sh says).
#
#   bench/run_security_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$build/tools/batonctl" make-model --preset tiny --seed 0 --out "$out/model" >/dev/null
printf '"bench-key-of-tenant-a-0123": tenant-a\n' >"$out/keys.yaml"
chmod 600 "$out/keys.yaml"

grpc_attack() {
  local dir="$1" ready="$out/ready" pid base peak cpu0 cpu1
  rm -f "$ready"
  "$dir/router/baton-router" --model "$out/model" --insecure-internal --port 0 \
    --api-keys "$out/keys.yaml" --metrics-port -1 --ready-file "$ready" >"$out/router.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ -s "$ready" ]] && break; sleep 0.1; done
  echo 5 >"/proc/$pid/clear_refs"
  base=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
  cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  "$build/bench/baton_unauth_grpc_bench" "$(cat "$ready")" 16 62914560 | cut -c1-40 | sort |
    uniq -c | sed 's/^/    /'
  peak=$(awk '/VmHWM/{print $2}' "/proc/$pid/status")
  cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  echo "grpc attack ($dir): router peak RSS +$(((peak - base) / 1024)) MiB over" \
    "$((base / 1024)) MiB; CPU $(awk -v d=$((cpu1 - cpu0)) -v t="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", d / t}') s"
}

dirs=()
if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then dirs+=("$BEFORE_BUILD_DIR"); fi
dirs+=("$build")
for dir in "${dirs[@]}"; do
  grpc_attack "$dir"
  python3 "$root/bench/http_body_attack.py" "$dir/tools" "$out/http-$(basename "$dir")"
done
