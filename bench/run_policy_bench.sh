#!/usr/bin/env bash
# Routing policies on the Mooncake conversation trace, measured and simulated in one run: for
# each policy, a fresh `baton up --prefill-nodes P --decode-nodes D --split S` (small preset,
# each prefill node with a 512 MiB block cache) replays the first N requests of the trace
# (`batonctl replay`: prompts scaled by LENGTH_SCALE, arrivals by TIME_SCALE, completions
# capped at 16 tokens); before it stops, `batonctl rates` reads what its nodes measured (the
# prefill nodes' rates, the decode nodes' step-cost fit, tokens per step and, with
# replay-on-decode, their replay rate and replay piece costs), and `batonctl simulate --policy`
# runs the same requests through the router's placement and cost model and the decode node's
# step planner at those rates, with the same cluster shape and 16-token completions.
# Prints TTFT p50/p99/mean, ITL p50/p99, hit tokens by tier and throughput per policy,
# measured and predicted, and each simulated figure over the measured one; and the TTFT the
# router predicted for each request as it placed it ("router"), over the measured one. It also simulates
# without the decode steps' spread ("no spread": every step at the mean step stretch, without
# step_stretch_p10..p99), and at the decode node's fits alone ("fits only": without its step
# stretch or spread, and with
# replay-on-decode a replay as a delay beside the steps rather than pieces in them), the model
# before the simulated steps took those from the node, from the same rates.
#
#   [N=150] [LENGTH_SCALE=0.0625] [TIME_SCALE=2] [PREFILL_NODES=2] [DECODE_NODES=1]
#   [SPLIT=prefill-all|replay-on-decode] [POLICIES="least-loaded longest-prefix predicted-ttft"]
#   [THREADS_PER_NODE=N] [LOGS=DIR] bench/run_policy_bench.sh
# THREADS_PER_NODE (baton up --threads-per-node) sizes each prefill and decode node's thread
# team, as the chart sizes a pod's to its CPU request. The default is each node's share of the
# machine's cores (at least 1): the simulator's nodes are separate machines, and nodes whose
# teams each take every core slow each other whenever two compute at once. 0 gives every node's
# team every core, as `baton up` does by default.
# LOGS keeps each policy's cluster log (up-POLICY.log: the nodes' "prefill done" lines carry
# each prefill's stages and its estimated work), replay and rates in DIR.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
trace="${TRACE:-$root/../shared/traces/mooncake_synthetic_trace.jsonl}"
n="${N:-150}" length_scale="${LENGTH_SCALE:-0.0625}" time_scale="${TIME_SCALE:-2}"
prefill_nodes="${PREFILL_NODES:-2}" decode_nodes="${DECODE_NODES:-1}" split="${SPLIT:-prefill-all}"
share=$(($(nproc) / (prefill_nodes + decode_nodes)))
threads="${THREADS_PER_NODE:-$((share > 0 ? share : 1))}"
team=""
[[ $threads != 0 ]] && team="--threads-per-node $threads"
policies="${POLICIES:-least-loaded longest-prefix predicted-ttft}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
# Each request's simulated placement, where the build's simulate lists it (an older build, run
# for comparison, does not).
per_request=""
[[ "$("$build/tools/batonctl" simulate --help)" == *--per-request* ]] && per_request=--per-request
"$build/tools/batonctl" make-model --preset small --out "$out/small" >/dev/null
echo "cluster: $prefill_nodes prefill + $decode_nodes decode nodes, $split; $n requests${team:+; $team}"
for policy in $policies; do
  BATON_UP_ARGS="--prefill-nodes $prefill_nodes --decode-nodes $decode_nodes --split $split
    --prefill-policy $policy $team" start_baton_up "$build" "$out/small"
  "$build/tools/batonctl" replay --trace "$trace" --addr "$addr" --max-requests "$n" \
    --length-scale "$length_scale" --time-scale "$time_scale" --max-output-tokens 16 \
    --concurrency 16 --no-progress --json >"$out/replay-$policy.json"
  # The nodes' last heartbeats carry what they measured up to the end of the replay.
  sleep 2
  "$build/tools/batonctl" rates --addr "$addr" >"$out/rates-$policy.json"
  if [[ -n "${LOGS:-}" ]]; then
    mkdir -p "$LOGS"
    cp "$work/up.log" "$LOGS/up-$policy.log"
    cp "$out/replay-$policy.json" "$out/rates-$policy.json" "$LOGS/"
  fi
  stop_baton_up
  rates="$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rates"])' \
    "$out/rates-$policy.json")"
  decode_rates="$(/usr/bin/python3 -c \
    'import json,sys; print(json.load(open(sys.argv[1]))["decode_rates"])' "$out/rates-$policy.json")"
  echo "$policy rates: ${rates:-none measured} decode rates: ${decode_rates:-none measured}"
  simulate() {
    "$build/tools/batonctl" simulate --trace "$trace" --model-config "$out/small/config.json" \
      --max-requests "$n" --length-scale "$length_scale" --time-scale "$time_scale" \
      --policy "$policy" --prefill-nodes "$prefill_nodes" --block-cache-bytes 512MiB \
      ${rates:+--rates "$rates"} --decode-nodes "$decode_nodes" --decode-slots 64 \
      ${1:+--decode-rates "$1"} --max-output-tokens 16 --json $per_request
  }
  simulate "$decode_rates" >"$out/sim-$policy.json"
  # Without the steps' spread: every step at the mean stretch.
  simulate "$(sed -E 's/,?step_stretch_p[0-9]+=[^,]*//g; s/^,//' <<<"$decode_rates")" \
    >"$out/mean-$policy.json"
  # The model before the decode steps were planned as the node plans them: no replay piece
  # costs (a replay is a delay beside the steps) and no step stretch.
  simulate "$(sed -E 's/,?(replay_piece_[a-z_]*|step_stretch[a-z0-9_]*)=[^,]*//g; s/^,//' \
    <<<"$decode_rates")" >"$out/fits-$policy.json"

done
/usr/bin/python3 - "$out" "$policies" <<'PY'
import json, os, sys
out, policies = sys.argv[1], sys.argv[2].split()
print(f"{'policy':15s} {'':9s} {'TTFT p50':>9s} {'p99':>9s} {'mean':>9s} {'ITL p50':>8s} "
      f"{'p99':>8s} {'local tok':>10s} {'store tok':>10s} {'req/s':>7s}")
ratio = lambda a, b: a / b if b > 0 else float("nan")
for policy in policies:
    r = json.load(open(os.path.join(out, f"replay-{policy}.json")))
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{policy:15s} {'measured':9s} {t['p50']:9.1f} {t['p99']:9.1f} {t['mean']:9.1f} "
          f"{i['p50']:8.1f} {i['p99']:8.1f} "
          f"{r['local_cached_tokens']:10d} {r['store_cached_tokens']:10d} {r['requests_per_s']:7.2f}"
          f"   ({r['completed']} of {r['requests']} completed)")
    # What the router predicted for each request when it placed it (its cost model at the
    # nodes' reported rates), against what the request measured.
    pr = r["predicted_ttft_ms"]
    pairs = sorted(q["predicted_ttft_ms"] / q["ttft_ms"] for q in r["per_request"]
                   if q["ok"] and q["ttft_ms"] > 0 and q["predicted_ttft_ms"] > 0)
    if pairs:
        print(f"{'':15s} {'router':9s} {pr['p50']:9.1f} {pr['p99']:9.1f} {pr['mean']:9.1f}"
              f"   (per request, predicted / measured: p10 {pairs[len(pairs) // 10]:.3f}, "
              f"p50 {pairs[len(pairs) // 2]:.3f}, p90 {pairs[len(pairs) * 9 // 10]:.3f})")
        print(f"{'':15s} {'/measured':9s} {ratio(pr['p50'], t['p50']):9.3f} "
              f"{ratio(pr['p99'], t['p99']):9.3f} {ratio(pr['mean'], t['mean']):9.3f}")
    for kind, label in (("sim", "simulated"), ("mean", "no spread"), ("fits", "fits only")):
        path = os.path.join(out, f"{kind}-{policy}.json")
        if not os.path.exists(path):
            continue
        s = json.load(open(path))["results"][0]
        t2, i2 = s["ttft_ms"], s["itl_ms"]
        print(f"{'':15s} {label:9s} {t2['p50']:9.1f} {t2['p99']:9.1f} {t2['mean']:9.1f} "
              f"{i2['p50']:8.1f} {i2['p99']:8.1f} "
              f"{s['local_cached_tokens']:10d} {s['store_cached_tokens']:10d} "
              f"{s['requests_per_s']:7.2f}   (replay: {s['decode']['replay']})")
        print(f"{'':15s} {'/measured':9s} {ratio(t2['p50'], t['p50']):9.3f} "
              f"{ratio(t2['p99'], t['p99']):9.3f} {ratio(t2['mean'], t['mean']):9.3f} "
              f"{ratio(i2['p50'], i['p50']):8.3f} {ratio(i2['p99'], i['p99']):8.3f}")
        # Request by request: the simulated TTFT over the measured one, and the simulated
        # service alone (its predicted load, compute and fixed cost, without the waits) over it.
        sim = s.get("per_request", [])
        both = [(q, sim[q["index"]]) for q in r["per_request"]
                if q["ok"] and q["ttft_ms"] > 0 and q["index"] < len(sim)
                and sim[q["index"]]["ttft_ms"] is not None]
        if both:
            at = lambda v, f: v[min(len(v) - 1, int(len(v) * f))]
            t_ratio = sorted(p["ttft_ms"] / q["ttft_ms"] for q, p in both)
            s_ratio = sorted(p["service_ms"] / q["ttft_ms"] for q, p in both)
            print(f"{'':15s} {'':9s} per request, simulated / measured TTFT: p10 "
                  f"{at(t_ratio, .1):.3f}, p50 {at(t_ratio, .5):.3f}, p90 {at(t_ratio, .9):.3f}; "
                  f"service alone: p10 {at(s_ratio, .1):.3f}, p50 {at(s_ratio, .5):.3f}, "
                  f"p90 {at(s_ratio, .9):.3f}")
PY
rm -rf "$out"
