#!/usr/bin/env bash
# The prefix cache's two tiers in one run: TTFT of a 4,096-token prompt on the small preset
# through `baton up`, cold and with 50%, 90% and the cap (95%: floor((L - C) / B) = 61 of 64
# blocks) cached, once with the hit in the shared store only (--block-cache-bytes 0) and once
# in the prefill node's local block cache (512 MiB). Each figure is a median of REPEATS
# prompts (default 3) and is quoted against the cold median of its own cluster.
#
#   bench/run_tier_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
for tier in store local; do
  if [[ $tier == store ]]; then BATON_UP_ARGS="--block-cache-bytes 0"; else BATON_UP_ARGS=""; fi
  BATON_UP_ARGS="$BATON_UP_ARGS" start_baton_up "$build"
  "$build/bench/baton_prefix_bench" --addr "$addr" --kvstore "$(cat "$work/data/run/kvstore.addr")" \
    --tls-dir "$work/data/tls" --shares 0,0.5,0.9,1 --repeats "${REPEATS:-3}" >"$out/$tier.json"
  stop_baton_up
done
/usr/bin/python3 - "$out/store.json" "$out/local.json" <<'PY'
import json, sys
print("tier   share  cached  local  TTFT median ms  vs cold")
for path, tier in zip(sys.argv[1:], ("store", "local")):
    rows = json.load(open(path))
    cold = rows[0]["ttft_ms_median"]
    for r in rows:
        share = r["cached_tokens"] / 4096
        print(f"{tier:5s}  {share:5.3f}  {r['cached_tokens']:6d}  {r['local_cached_tokens']:5d}  "
              f"{r['ttft_ms_median']:14.1f}  {r['ttft_ms_median'] / cold:7.3f}")
PY
rm -rf "$out"
