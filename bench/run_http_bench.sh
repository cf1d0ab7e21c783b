#!/usr/bin/env bash
# Time to first token and inter-token latency through the router's OpenAI-compatible HTTP API
# (streamed /v1/completions) against gRPC, in one run of `baton up`'s default model (the small
# preset with its tokenizer), at 1 and 32 concurrent streams; prompts of the same length (token
# ids) and the same completion lengths both ways, each level run gRPC, HTTP, HTTP, gRPC. Prints
# every pass and HTTP / gRPC ratios of the two passes' means.
#
#   bench/run_http_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
source "$root/bench/baton_up.sh"
start_baton_up "$build"
if [[ -z "$http" ]]; then
  echo "run_http_bench: baton up serves no HTTP API (see $work/up.log)" >&2
  exit 1
fi
"$build/bench/baton_serving_bench" --addr "$addr" --http "$http" \
  --concurrency "${CONCURRENCY:-1,32}" --requests "${REQUESTS:-4}" \
  --prompt-len "${PROMPT_LEN:-256}" --max-tokens "${MAX_TOKENS:-32}" >"$work/http.json"
/usr/bin/python3 - "$work/http.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print("api   streams  requests  errors  TTFT p50/p90 ms      ITL p50/p90 ms   out tok/s")
for r in rows:
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{r['api']:5s} {r['streams']:7d}  {r['requests']:8d}  {r['errors']:6d}  {t['p50']:7.1f} {t['p90']:7.1f}   "
          f"{i['p50']:6.1f} {i['p90']:6.1f}   {r['output_tokens_per_s']:8.1f}")
# Each level ran gRPC, HTTP, HTTP, gRPC: each side's figure is the mean of its two passes.
def mean(api, streams, key):
    values = [key(r) for r in rows if r["api"] == api and r["streams"] == streams]
    return sum(values) / len(values)
for streams in sorted({r["streams"] for r in rows}):
    ratio = lambda key: mean("http", streams, key) / mean("grpc", streams, key)
    print(f"HTTP/gRPC at {streams} streams (mean of two passes each): "
          f"TTFT p50 {ratio(lambda r: r['ttft_ms']['p50']):.3f}, "
          f"ITL p50 {ratio(lambda r: r['itl_ms']['p50']):.3f}, "
          f"tok/s {ratio(lambda r: r['output_tokens_per_s']):.3f}")
PY
