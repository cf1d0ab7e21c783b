#!/usr/bin/env bash
# What internal mutual TLS costs: TTFT and ITL of the small preset through `baton up` with
# mTLS (the default) and with --insecure-internal, at 1 and 8 concurrent streams, alternating
# the two clusters ROUNDS times (default 2) in one run so that both see the same machine; prints
# the medians over rounds and the mTLS / plaintext ratios.
#
#   bench/run_mtls_bench.sh [MODEL_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model="${1:-$work/small}"
[[ -f "$model/config.json" ]] || "$build/tools/batonctl" make-model --preset small --out "$model" >/dev/null

run() {  # run MODE ROUND: one baton up, one serving benchmark
  local mode="$1" round="$2" data="$work/data-$1" extra=()
  [[ "$mode" == plain ]] && extra=(--insecure-internal)
  rm -rf "$data/run"
  "$build/tools/baton" up --port 0 --model "$model" --data-dir "$data" "${extra[@]}" \
    >"$work/up-$mode.log" 2>&1 &
  local up=$!
  for _ in $(seq 600); do grep -q "router at" "$work/up-$mode.log" && break; sleep 0.2; done
  "$build/bench/baton_serving_bench" --addr "$(cat "$data/run/router.addr")" \
    --concurrency "${CONCURRENCY:-1,8}" --requests "${REQUESTS:-6}" \
    --prompt-len "${PROMPT_LEN:-512}" --max-tokens "${MAX_TOKENS:-32}" >"$work/$mode-$round.json"
  kill -INT "$up"
  wait "$up" || true
}
for round in $(seq "${ROUNDS:-2}"); do
  run mtls "$round"
  run plain "$round"
done
/usr/bin/python3 - "$work" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
def load(mode):
    rows = {}
    for path in sorted(glob.glob(f"{work}/{mode}-*.json")):
        for r in json.load(open(path)):
            rows.setdefault(r["streams"], []).append(r)
    return rows
mtls, plain = load("mtls"), load("plain")
med = lambda rs, k, p: statistics.median(r[k][p] for r in rs)
print("streams  metric      mTLS ms  plaintext ms  mTLS/plaintext")
for streams in sorted(mtls):
    for key in ("ttft_ms", "itl_ms"):
        for p in ("p50", "p99"):
            a, b = med(mtls[streams], key, p), med(plain[streams], key, p)
            print(f"{streams:7d}  {key[:-3]:4s} {p:4s}  {a:8.2f}  {b:12.2f}  {a / b:14.3f}")
    errors = sum(r["errors"] for r in mtls[streams] + plain[streams])
    if errors:
        print(f"{streams:7d}  errors: {errors}")
PY
