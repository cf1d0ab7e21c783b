#!/usr/bin/env bash
# The two splits on the Mooncake conversation trace, measured and simulated in one run: for
# prefill-all and replay-on-decode, a fresh `baton up --split S` (small preset, 1 prefill and 1
# decode node, predicted-ttft routing) replays the first N requests of the trace (`batonctl
# replay`: prompts scaled by LENGTH_SCALE, arrivals by TIME_SCALE, completions capped at 16
# tokens); `batonctl rates --addr` then reads what the nodes measured from the router (the
# prefill node's rates, the decode node's step fit and, under replay-on-decode, its replay
# rate), and `batonctl simulate` runs the same requests at those rates. Prints TTFT and ITL
# p50/p99 measured and simulated per split, each simulated figure over the measured one, and
# the rates the router held.
#
#   [N=150] [LENGTH_SCALE=0.0625] [TIME_SCALE=2] bench/run_split_sim_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
trace="${TRACE:-$root/../shared/traces/mooncake_synthetic_trace.jsonl}"
n="${N:-150}" length_scale="${LENGTH_SCALE:-0.0625}" time_scale="${TIME_SCALE:-2}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
"$build/tools/batonctl" make-model --preset small --out "$out/small" >/dev/null
for split in prefill-all replay-on-decode; do
  BATON_UP_ARGS="--split $split" start_baton_up "$build" "$out/small"
  "$build/tools/batonctl" replay --trace "$trace" --addr "$addr" --max-requests "$n" \
    --length-scale "$length_scale" --time-scale "$time_scale" --max-output-tokens 16 \
    --concurrency 16 --no-progress --json >"$out/replay-$split.json"
  # The nodes' last heartbeats carry what they measured up to the end of the replay.
  sleep 2
  "$build/tools/batonctl" rates --addr "$addr" >"$out/rates-$split.json"
  read -r -a flags <<<"$("$build/tools/batonctl" rates --addr "$addr" --flags)"
  stop_baton_up
  echo "$split: ${flags[*]}"
  "$build/tools/batonctl" simulate --trace "$trace" --model-config "$out/small/config.json" \
    --max-requests "$n" --length-scale "$length_scale" --time-scale "$time_scale" \
    --policy predicted-ttft --prefill-nodes 1 --block-cache-bytes 512MiB \
    --decode-nodes 1 --decode-slots 64 "${flags[@]}" \
    --max-output-tokens 16 --json >"$out/sim-$split.json"
done
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'split':17s} {'':9s} {'TTFT p50':>9s} {'p99':>9s} {'ITL p50':>8s} {'p99':>8s} {'req/s':>7s}")
for split in ("prefill-all", "replay-on-decode"):
    r = json.load(open(os.path.join(out, f"replay-{split}.json")))
    s = json.load(open(os.path.join(out, f"sim-{split}.json")))["results"][0]
    rows = (("measured", r), ("simulated", s))
    for name, x in rows:
        t, i = x["ttft_ms"], x["itl_ms"]
        print(f"{split if name == 'measured' else '':17s} {name:9s} {t['p50']:9.1f} {t['p99']:9.1f} "
              f"{i['p50']:8.1f} {i['p99']:8.1f} {x['requests_per_s']:7.2f}")
    ratio = lambda a, b: a / b if b > 0 else float("nan")
    t, i, t2, i2 = r["ttft_ms"], r["itl_ms"], s["ttft_ms"], s["itl_ms"]
    print(f"{'':17s} {'sim/meas':9s} {ratio(t2['p50'], t['p50']):9.3f} "
          f"{ratio(t2['p99'], t['p99']):9.3f} {ratio(i2['p50'], i['p50']):8.3f} "
          f"{ratio(i2['p99'], i['p99']):8.3f}   ({r['completed']} of {r['requests']} completed)")
    rates = json.load(open(os.path.join(out, f"rates-{split}.json")))
    print(f"{'':17s} router: split {rates['split']}, rates {rates['rates']}; "
          f"decode {rates['decode_rates']}")
PY
rm -rf "$out"
