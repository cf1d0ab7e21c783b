#!/usr/bin/env bash
# The prefix cache's two tiers in one run: TTFT of a LENGTH-token prompt (default 4,096) on the
# small preset through `baton up`, cold and with 50%, 90% and the cap (at 4,096 tokens 95%:
# floor((L - C) / B) = 61 of 64 blocks) cached, once with the hit in the shared store only
# (--block-cache-bytes 0) and once in the prefill node's local block cache (512 MiB). Each
# figure is a median of REPEATS prompts (default 3) and is quoted against the cold median of
# its own cluster. TIERS picks the tiers (default "store local").
#
# LOGS=DIR keeps each tier's cluster log (up-TIER.log): the prefill node's "prefill done" lines
# carry each hit's load_store, load_local and compute ms (stage_ms), the store's "blocks read"
# lines each read's ms.
#
#   [LENGTH=4096] [REPEATS=3] [TIERS="store local"] [LOGS=DIR] bench/run_tier_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
for tier in ${TIERS:-store local}; do
  if [[ $tier == store ]]; then BATON_UP_ARGS="--block-cache-bytes 0"; else BATON_UP_ARGS=""; fi
  BATON_UP_ARGS="$BATON_UP_ARGS" start_baton_up "$build"
  "$build/bench/baton_prefix_bench" --addr "$addr" --kvstore "$(cat "$work/data/run/kvstore.addr")" \
    --tls-dir "$work/data/tls" --length "${LENGTH:-4096}" --shares 0,0.5,0.9,1 \
    --repeats "${REPEATS:-3}" >"$out/$tier.json"
  if [[ -n "${LOGS:-}" ]]; then
    mkdir -p "$LOGS"
    cp "$work/up.log" "$LOGS/up-$tier.log"
  fi
  stop_baton_up
done
/usr/bin/python3 - "$out" "${LENGTH:-4096}" ${TIERS:-store local} <<'PY'
import json, os, sys
out, length, tiers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("tier   share  cached  local  TTFT median ms  vs cold  prefill ms  transfer ms")
for tier in tiers:
    rows = json.load(open(os.path.join(out, f"{tier}.json")))
    cold = rows[0]["ttft_ms_median"]
    for r in rows:
        share = r["cached_tokens"] / length
        print(f"{tier:5s}  {share:5.3f}  {r['cached_tokens']:6d}  {r['local_cached_tokens']:5d}  "
              f"{r['ttft_ms_median']:14.1f}  {r['ttft_ms_median'] / cold:7.3f}  "
              f"{r.get('prefill_ms_median', 0):10.1f}  {r.get('transfer_ms_median', 0):11.1f}")
PY
rm -rf "$out"
