#!/usr/bin/env bash
# Time to first token and inter-token latency of the small preset through `baton up`, at 1, 8
# and 32 concurrent streams (512-token prompts, 32 completion tokens, serving default truncation).
#
#   bench/run_serving_bench.sh [MODEL_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
source "$root/bench/baton_up.sh"
start_baton_up "$build" "${1:-}"
"$build/bench/baton_serving_bench" --addr "$addr" --concurrency "${CONCURRENCY:-1,8,32}" \
  --requests "${REQUESTS:-4}" --prompt-len "${PROMPT_LEN:-512}" --max-tokens "${MAX_TOKENS:-32}" \
  >"$work/serving.json"
/usr/bin/python3 - "$work/serving.json" <<'PY'
import json, sys
print("streams  requests  errors  TTFT p50/p90/p99 ms        ITL p50/p90/p99 ms      out tok/s")
for r in json.load(open(sys.argv[1])):
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{r['streams']:7d}  {r['requests']:8d}  {r['errors']:6d}  {t['p50']:7.1f} {t['p90']:7.1f} {t['p99']:7.1f}   "
          f"{i['p50']:6.1f} {i['p90']:6.1f} {i['p99']:6.1f}   {r['output_tokens_per_s']:8.1f}")
PY
