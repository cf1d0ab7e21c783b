#!/usr/bin/env bash
# Time to first token and inter-token latency through the router's OpenAI-compatible HTTP API
# (streamed /v1/completions) against gRPC, in one run of `baton up`'s default model (the small
# preset with its tokenizer), at 1 and 32 concurrent streams; prompts of the same length (token
# ids) and the same completion lengths both ways, each level run gRPC, HTTP, HTTP, gRPC. Prints
# every pass and HTTP / gRPC ratios of the two passes' means.
#
#   bench/run_http_bench.sh
#
# BEFORE_BUILD_DIR=<another build> compares this build's HTTP front with that build's (say, one
# of the commit before the front moved to Boost.Beast): `baton up` of each build in turn, before,
# after, after, before, each pass the whole gRPC/HTTP run above with this build's bench client,
# then after/before ratios of the HTTP figures (the mean of each side's two passes), beside the
# same ratios of gRPC (which no front serves, so they show what the two clusters differ in
# besides the front).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
source "$root/bench/baton_up.sh"
results="$(mktemp -d)"
trap 'stop_baton_up; rm -rf "$results"' EXIT

# One pass against `baton up` of the build in $1, its rows (with "front": $2) into $3.
run_pass() {
  local up_build="$1" front="$2" out="$3"
  start_baton_up "$up_build"
  trap 'stop_baton_up; rm -rf "$results"' EXIT  # start_baton_up set its own
  if [[ -z "$http" ]]; then
    echo "run_http_bench: baton up of $up_build serves no HTTP API (see $work/up.log)" >&2
    exit 1
  fi
  "$build/bench/baton_serving_bench" --addr "$addr" --http "$http" \
    --concurrency "${CONCURRENCY:-1,32}" --requests "${REQUESTS:-4}" \
    --prompt-len "${PROMPT_LEN:-256}" --max-tokens "${MAX_TOKENS:-32}" >"$out.raw"
  /usr/bin/python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
for r in rows: r["front"] = sys.argv[2]
json.dump(rows, open(sys.argv[3], "w"))' "$out.raw" "$front" "$out"
  stop_baton_up
}

if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then
  run_pass "$BEFORE_BUILD_DIR" before "$results/1.json"
  run_pass "$build" after "$results/2.json"
  run_pass "$build" after "$results/3.json"
  run_pass "$BEFORE_BUILD_DIR" before "$results/4.json"
else
  run_pass "$build" after "$results/1.json"
fi

/usr/bin/python3 - "$results"/*.json <<'PY'
import json, sys
rows = [r for path in sys.argv[1:] for r in json.load(open(path))]
print("front   api   streams  requests  errors  TTFT p50/p90 ms      ITL p50/p90 ms   out tok/s")
for r in rows:
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{r['front']:7s} {r['api']:5s} {r['streams']:7d}  {r['requests']:8d}  {r['errors']:6d}  "
          f"{t['p50']:7.1f} {t['p90']:7.1f}   {i['p50']:6.1f} {i['p90']:6.1f}   "
          f"{r['output_tokens_per_s']:8.1f}")
def mean(front, api, streams, key):
    values = [key(r) for r in rows
              if r["front"] == front and r["api"] == api and r["streams"] == streams]
    return sum(values) / len(values)
ttft = lambda r: r["ttft_ms"]["p50"]
itl = lambda r: r["itl_ms"]["p50"]
tok = lambda r: r["output_tokens_per_s"]
fronts = sorted({r["front"] for r in rows})
for streams in sorted({r["streams"] for r in rows}):
    for front in fronts:
        # Each level ran gRPC, HTTP, HTTP, gRPC: each side's figure is the mean of its passes.
        ratio = lambda key: mean(front, "http", streams, key) / mean(front, "grpc", streams, key)
        print(f"{front}: HTTP/gRPC at {streams} streams (mean of the passes): "
              f"TTFT p50 {ratio(ttft):.3f}, ITL p50 {ratio(itl):.3f}, tok/s {ratio(tok):.3f}")
    if fronts == ["after", "before"]:
        for api in ("http", "grpc"):
            ratio = lambda key: mean("after", api, streams, key) / mean("before", api, streams, key)
            print(f"after/before {api.upper()} at {streams} streams (mean of two passes each): "
                  f"TTFT p50 {ratio(ttft):.3f}, ITL p50 {ratio(itl):.3f}, tok/s {ratio(tok):.3f}")
PY
