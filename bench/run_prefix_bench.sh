#!/usr/bin/env bash
# Prefix-cache figures in one run: TTFT of a 4,096-token prompt on the small preset through
# `baton up` cold and with 50% and 90% of it in the prefix store, and the store's write/read
# throughput for 64-position blocks.
#
#   bench/run_prefix_bench.sh [MODEL_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
model="${1:-$work/small}"
[[ -f "$model/config.json" ]] || "$build/tools/batonctl" make-model --preset small --out "$model" >/dev/null
"$build/tools/baton" up --port 0 --model "$model" --data-dir "$work/data" >"$work/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 600); do grep -q "router at" "$work/up.log" && break; sleep 0.2; done
"$build/bench/baton_prefix_bench" --addr "$(cat "$work/data/run/router.addr")" \
  --kvstore "$(cat "$work/data/run/kvstore.addr")" --tls-dir "$work/data/tls" --repeats "${REPEATS:-3}" >"$work/ttft.json"
"$build/bench/baton_store_bench" --model "$model" --dir "$work/store" >"$work/store.json"
/usr/bin/python3 - "$work/ttft.json" "$work/store.json" <<'PY'
import json, sys
ttft, store = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
cold = ttft[0]["ttft_ms_median"]
print("cached share  cached tokens  TTFT median ms  vs cold")
for r in ttft:
    print(f"{r['share']:12.1f}  {r['cached_tokens']:13d}  {r['ttft_ms_median']:14.1f}  {r['ttft_ms_median'] / cold:7.3f}")
for region in ("block_kv", "producer_swa"):
    s = store[region]
    print(f"store {region}: {s['blocks']} blocks of {s['value_bytes']} bytes: "
          f"write {s['write_mib_per_s']:.0f} MiB/s, read {s['read_mib_per_s']:.0f} MiB/s")
PY
