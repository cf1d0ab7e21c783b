#!/usr/bin/env bash
# Load figures through `baton up` (the small preset unless MODEL_DIR is given): throughput and
# TTFT/ITL p50/p99 at 64 and 256 concurrent streams (one request each: 128-token prompts, 8
# tokens), and goodput at a fixed request rate (RATE requests/s, RATE_REQUESTS of them; the
# share meeting TTFT <= 2 s and every inter-token gap <= 200 ms). Point BATON_BUILD_DIR at
# another build to measure it the same way (before/after).
#
#   bench/run_load_bench.sh [MODEL_DIR]      (STREAMS=64,256 RATE=2 RATE_REQUESTS=48)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
bench="${BENCH_BUILD_DIR:-$root/build}/bench/baton_serving_bench"
source "$root/bench/baton_up.sh"
start_baton_up "$build" "${1:-}"
"$bench" --addr "$addr" --concurrency "${STREAMS:-64,256}" --requests 1 --prompt-len 128 \
  --max-tokens 8 >"$work/streams.json"
"$bench" --addr "$addr" --rate "${RATE:-2}" --rate-requests "${RATE_REQUESTS:-48}" \
  --prompt-len 128 --max-tokens 8 >"$work/rate.json"
/usr/bin/python3 - "$work/streams.json" "$work/rate.json" <<'PY'
import json, sys
print("streams  errors  TTFT p50/p99 ms      ITL p50/p99 ms    out tok/s")
for r in json.load(open(sys.argv[1])):
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{r['streams']:7d}  {r['errors']:6d}  {t['p50']:8.1f} {t['p99']:8.1f}   "
          f"{i['p50']:6.1f} {i['p99']:7.1f}   {r['output_tokens_per_s']:8.1f}")
for r in json.load(open(sys.argv[2])):
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"rate {r['rate']}/s, {r['requests']} requests: errors {r['errors']}, goodput "
          f"{r['goodput']:.3f}, TTFT p50/p99 {t['p50']:.1f}/{t['p99']:.1f} ms, ITL p50/p99 "
          f"{i['p50']:.1f}/{i['p99']:.1f} ms")
PY
