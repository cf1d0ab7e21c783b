#!/usr/bin/env bash
# Shadow verification (docs/fidelity.md, "In production") on `baton up`'s trained default model
# (ced-brown-shared: 512 positions, C = 70) with the Mooncake trace, its lengths scaled by
# LENGTH_SCALE (default 0.01) and only the requests whose scaled prompt and output fit the
# model's 512 positions:
#   1. the live figures (`batonctl fidelity`) with every truncated request shadowed
#      (--fidelity-sample-rate 1), at K = C and at K = 140, to set beside docs/fidelity.md's
#      offline ones for the same K;
#   2. the cost of sampling: throughput, TTFT and ITL p50/p99 at sample rates 0, 0.01 and 0.1, in one
#      run, ROUNDS times in turn (default 2: 0, 0.01, 0.1, 0, 0.01, 0.1), each on a fresh
#      cluster, with the shadows run and dropped.
#
#   [MODEL_DIR=models/ced-brown-shared] [REQUESTS=300] [LENGTH_SCALE=0.01] [TIME_SCALE=0.5] [ROUNDS=2] [PARTS="live cost"]
#     bench/run_fidelity_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
batonctl="$build/tools/batonctl"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
scale="${LENGTH_SCALE:-0.01}"
model="${MODEL_DIR:-$root/models/ced-brown-shared}"  # baton up's default model
max_output=32
/usr/bin/python3 - "$root/../shared/traces/mooncake_synthetic_trace.jsonl" "$scale" \
  "${REQUESTS:-300}" "$max_output" "$out/trace.jsonl" <<'PY'
import json, sys
source, scale, count, max_output, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kept = []
for line in open(source):
    r = json.loads(line)
    if round(r["input_length"] * scale) + min(r["output_length"], max_output) <= 500:
        kept.append(r)
    if len(kept) == count:
        break
t0 = kept[0]["timestamp"]
with open(out, "w") as f:
    for r in kept:
        f.write(json.dumps(dict(r, timestamp=r["timestamp"] - t0)) + "\n")
PY
echo "trace: $(wc -l <"$out/trace.jsonl") Mooncake requests, lengths x $scale"

replay() {  # OUT [--keep K]
  local file="$1"
  shift
  "$batonctl" replay --addr "$addr" --trace "$out/trace.jsonl" --length-scale "$scale" \
    --time-scale "${TIME_SCALE:-0.5}" --max-output-tokens "$max_output" --vocab-size 4096 \
    --no-progress --json "$@" >"$file"
}

parts="${PARTS:-live cost}"
# 1. Live figures at K = C and K = 140, every truncated request shadowed.
if [[ " $parts " == *" live "* ]]; then
for keep in 70 140; do
  BATON_UP_ARGS="--fidelity-sample-rate 1" start_baton_up "$build" "$model"
  replay "$out/live-$keep.replay.json" --keep "$keep"
  # The shadows still queued run once the replay is done: read the figures once their count
  # has stood still for 5 s (the decode node's heartbeat carries them to the router).
  last="" same=0
  for _ in $(seq 180); do
    "$batonctl" fidelity --addr "$addr" --json >"$out/live-$keep.json"
    now="$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["shadows_run"] + d["shadows_dropped"] + d["shadows_failed"])' "$out/live-$keep.json")"
    if [[ "$now" == "$last" ]]; then same=$((same + 1)); else same=0; fi
    last="$now"
    [[ $same -ge 5 ]] && break
    sleep 1
  done
  stop_baton_up
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("K    shadows run/dropped  positions  top-1 agreement  mean KL (nats)  max |dlogit|")
for keep in (70, 140):
    d = json.load(open(f"{out}/live-{keep}.json"))
    n = sum(r["positions"] for r in d["results"])
    dis = sum(r["top1_disagreements"] for r in d["results"])
    kl = sum(r["kl_mean"] * r["positions"] for r in d["results"])
    mx = max((r["max_abs_logit_diff"] for r in d["results"]), default=0)
    agree = 1 - dis / n if n else float("nan")
    print(f"{keep:<4d} {d['shadows_run']:>6d}/{d['shadows_dropped']:<6d}      {n:9d}  {agree:15.5f}  "
          f"{kl / n if n else float('nan'):14.3e}  {mx:12.3e}")
PY
fi

# 2. What sampling costs the served requests.
if [[ " $parts " == *" cost "* ]]; then
for ((round = 0; round < ${ROUNDS:-2}; ++round)); do
  for rate in 0 0.01 0.1; do
    BATON_UP_ARGS="--fidelity-sample-rate $rate" start_baton_up "$build" "$model"
    replay "$out/rate-$rate-$round.json"
    "$batonctl" fidelity --addr "$addr" --json >"$out/rate-$rate-$round.fidelity.json"
    stop_baton_up
  done
done
/usr/bin/python3 - "$out" "${ROUNDS:-2}" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("rate   round  output tok/s  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  shadows run/dropped")
for rnd in range(rounds):
    for rate in ("0", "0.01", "0.1"):
        d = json.load(open(f"{out}/rate-{rate}-{rnd}.json"))
        f = json.load(open(f"{out}/rate-{rate}-{rnd}.fidelity.json"))
        print(f"{rate:6s} {rnd:5d}  {d['output_tokens_per_s']:12.1f}  {d['ttft_ms']['p50']:11.1f}  "
              f"{d['ttft_ms']['p99']:11.1f}  {d['itl_ms']['p50']:10.2f}  {d['itl_ms']['p99']:10.2f}  "
              f"{f['shadows_run']}/{f['shadows_dropped']}")
PY
fi
rm -rf "$out"
