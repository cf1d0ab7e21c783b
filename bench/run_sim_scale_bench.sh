#!/usr/bin/env bash
# The cluster simulator at scale: the Mooncake trace tiled TILES times (each tile after the
# last, its hash ids offset so that tiles share no prefix: TILES x 3,993 requests at the
# trace's own rate), simulated at PREFILL_NODES + DECODE_NODES nodes with the small preset
# model, 512 MiB block caches and a 256 GiB store. Prints each build's wall seconds and peak
# memory, and what it predicted (TTFT p50/p99, both tiers' hit tokens), so two builds can be
# compared in one run: BASE=path/to/an/older/batonctl runs it first, then this build's, ROUNDS
# times (default 2: A B A B).
#
#   [TILES=25] [PREFILL_NODES=1000] [DECODE_NODES=100] [POLICY=predicted-ttft]
#     [BASE=... [ROUNDS=2]] bench/run_sim_scale_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
batonctl="${BATONCTL:-$root/build/tools/batonctl}"
tiles="${TILES:-25}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$batonctl" make-model --preset small --out "$work/model" >/dev/null
python3 "$root/bench/tile_trace.py" "$root/../shared/traces/mooncake_synthetic_trace.jsonl" "$tiles" \
  "$work/trace.jsonl"
echo "trace: $(wc -l <"$work/trace.jsonl") requests ($tiles tiles)"

run() {
  local name="$1" binary="$2"
  /usr/bin/time -f "%e %M" -o "$work/time" "$binary" simulate --trace "$work/trace.jsonl" \
    --model-config "$work/model/config.json" --policy "${POLICY:-predicted-ttft}" \
    --prefill-nodes "${PREFILL_NODES:-1000}" --decode-nodes "${DECODE_NODES:-100}" \
    --block-cache-bytes 512MiB --store-budget 256GiB --json >"$work/out.json"
  read -r seconds kib <"$work/time"
  python3 - "$work/out.json" "$name" "$seconds" "$kib" <<'PY'
import json, sys
out, name, seconds, kib = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
doc = json.load(open(out))
run = doc["results"][0]
ttft = run["ttft_ms"]
print(f"{name}: {seconds:.1f} s, {kib / 1048576:.2f} GiB peak; TTFT p50 {ttft['p50']:.1f} ms, "
      f"p99 {ttft['p99']:.1f} ms; local hit tokens {run['local_cached_tokens']}, "
      f"store hit tokens {run['store_cached_tokens']}")
PY
}

if [[ -n "${BASE:-}" ]]; then
  for ((round = 0; round < ${ROUNDS:-2}; ++round)); do
    run base "$BASE"
    run this "$batonctl"
  done
else
  run this "$batonctl"
fi
