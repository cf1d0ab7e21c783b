#!/usr/bin/env bash
# Routing policies on the Mooncake conversation trace, measured and simulated in one run: for
# each of least-loaded, longest-prefix and predicted-ttft, a fresh `baton up --prefill-nodes 2`
# (small preset, each prefill node with a 512 MiB block cache) replays the first N requests of
# the trace (`batonctl replay`: prompts scaled by LENGTH_SCALE, arrivals by TIME_SCALE,
# completions capped at 16 tokens), then `batonctl simulate --policy` runs the same requests
# through the router's cost model at the rates the two prefill nodes measured in that run
# (baton_prefill_rate_ms, averaged over the nodes), with the decode node modelled at its
# measured step-cost fit (baton_decode_step_cost_ms) and the same 16-token completions.
# Prints TTFT p50/p99/mean, ITL p50/p99, hit tokens by tier and throughput per policy,
# measured and predicted, and each simulated figure over the measured one.
#
#   [N=150] [LENGTH_SCALE=0.0625] [TIME_SCALE=2] bench/run_policy_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
trace="${TRACE:-$root/../shared/traces/mooncake_synthetic_trace.jsonl}"
n="${N:-150}" length_scale="${LENGTH_SCALE:-0.0625}" time_scale="${TIME_SCALE:-2}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
"$build/tools/batonctl" make-model --preset small --out "$out/small" >/dev/null
for policy in least-loaded longest-prefix predicted-ttft; do
  BATON_UP_ARGS="--prefill-nodes 2 --prefill-policy $policy" start_baton_up "$build" "$out/small"
  "$build/tools/batonctl" replay --trace "$trace" --addr "$addr" --max-requests "$n" \
    --length-scale "$length_scale" --time-scale "$time_scale" --max-output-tokens 16 \
    --concurrency 16 --no-progress --json >"$out/replay-$policy.json"
  for node in prefill prefill-1; do
    curl -s "http://$(cat "$work/data/run/$node.metrics")/metrics" >"$out/metrics-$policy-$node.txt"
  done
  curl -s "http://$(cat "$work/data/run/decode.metrics")/metrics" >"$out/decode-$policy.txt"
  decode_rates="$(sed -n 's/^baton_decode_step_cost_ms{term="fixed"} \(.*\)/step_fixed_ms=\1/p;
    s/^baton_decode_step_cost_ms{term="per_row"} \(.*\)/step_per_row_ms=\1/p' \
    "$out/decode-$policy.txt" | paste -sd, -)"
  echo "$policy decode rates: ${decode_rates:-none fitted, the simulator defaults}"
  stop_baton_up
  rates="$(/usr/bin/python3 - "$out"/metrics-"$policy"-*.txt <<'PY'
import re, sys
names = {"compute_per_gflop": "compute_ms_per_gflop", "local_per_mib": "local_ms_per_mib",
         "store_per_mib": "store_ms_per_mib", "fixed": "fixed_ms"}
sums = {}
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r'baton_prefill_rate_ms\{rate="(\w+)"\} (\S+)', line)
        if m and float(m.group(2)) > 0:
            sums.setdefault(names[m.group(1)], []).append(float(m.group(2)))
print(",".join(f"{k}={sum(v) / len(v):.6g}" for k, v in sums.items()))
PY
)"
  echo "$policy rates: $rates"
  "$build/tools/batonctl" simulate --trace "$trace" --model-config "$out/small/config.json" \
    --max-requests "$n" --length-scale "$length_scale" --time-scale "$time_scale" \
    --policy "$policy" --prefill-nodes 2 --block-cache-bytes 512MiB --rates "$rates" \
    --decode-nodes 1 --decode-slots 64 ${decode_rates:+--decode-rates "$decode_rates"} \
    --max-output-tokens 16 --json >"$out/sim-$policy.json"
done
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'policy':15s} {'':9s} {'TTFT p50':>9s} {'p99':>9s} {'mean':>9s} {'ITL p50':>8s} "
      f"{'p99':>8s} {'local tok':>10s} {'store tok':>10s} {'req/s':>7s}")
for policy in ("least-loaded", "longest-prefix", "predicted-ttft"):
    r = json.load(open(os.path.join(out, f"replay-{policy}.json")))
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{policy:15s} {'measured':9s} {t['p50']:9.1f} {t['p99']:9.1f} {t['mean']:9.1f} "
          f"{i['p50']:8.1f} {i['p99']:8.1f} "
          f"{r['local_cached_tokens']:10d} {r['store_cached_tokens']:10d} {r['requests_per_s']:7.2f}"
          f"   ({r['completed']} of {r['requests']} completed)")
    s = json.load(open(os.path.join(out, f"sim-{policy}.json")))["results"][0]
    t2, i2 = s["ttft_ms"], s["itl_ms"]
    print(f"{'':15s} {'simulated':9s} {t2['p50']:9.1f} {t2['p99']:9.1f} {t2['mean']:9.1f} "
          f"{i2['p50']:8.1f} {i2['p99']:8.1f} "
          f"{s['local_cached_tokens']:10d} {s['store_cached_tokens']:10d} {s['requests_per_s']:7.2f}")
    ratio = lambda a, b: a / b if b > 0 else float("nan")
    print(f"{'':15s} {'sim/meas':9s} {ratio(t2['p50'], t['p50']):9.3f} "
          f"{ratio(t2['p99'], t['p99']):9.3f} {ratio(t2['mean'], t['mean']):9.3f} "
          f"{ratio(i2['p50'], i['p50']):8.3f} {ratio(i2['p99'], i['p99']):8.3f}")
PY
rm -rf "$out"
