#!/usr/bin/env bash
# The router's registry and admission at 50, 200 and 1,000 prefill nodes (baton_registry_bench,
# in one process): each node heartbeating twice a second with a cache event batch while 50
# requests a second are admitted through the router's placement. Prints, per node count, the
# CPU per heartbeat and per request, the cores the heartbeats take, the admission latency p50
# and p99 (and the p99 of the admitting thread's own CPU time in it, with the share of the
# machine's CPU its hypervisor stole meanwhile: a wall-time tail far above the CPU-time one is
# waiting, not work), and the memory of the nodes' cache indexes; each count twice in one run:
# with the router's lookup (the chain walked once for every node) and with one lookup per open
# node (the router's way before; LOOKUPS=holders to skip it), and with BEFORE_BUILD_DIR=<an
# older build> that build's bench too, in the same run.
#
#   [NODES=50,200,1000] [SECONDS_PER_COUNT=5] [BLOCKS_PER_NODE=4096] [LOOKUPS="holders per-node"]
#   bench/run_registry_bench.sh
#
# With OVER_GRPC=1 the same node counts over the wire instead (baton_registry_grpc_bench): for
# each count, `baton up` (small preset) and that many simulated prefill nodes, each with its own
# certificate from the cluster's CA, registering and heartbeating through the router's Registry
# over mutual TLS while requests go through its client API to the real nodes; and a count of 0
# first, the cluster alone. Prints the router's CPU per heartbeat and per request, the cores
# the heartbeats take, its memory, and TTFT p50/p99 (heartbeats paused, and with them).
#
#   OVER_GRPC=1 [NODES=0,50,200,1000] [SECONDS_PER_COUNT=10] [REQUESTS_PER_S=10]
#   bench/run_registry_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
if [[ -n "${OVER_GRPC:-}" ]]; then
  # shellcheck source=bench/baton_up.sh
  source "$root/bench/baton_up.sh"
  models="$(mktemp -d)"
  "$build/tools/batonctl" make-model --preset small --out "$models/small" >/dev/null
  # The simulated nodes' heartbeats pause for one phase: the router keeps them live meanwhile.
  printf 'router:\n  node-expiry-ms: 120000\n' >"$models/baton.yaml"
  results="$models/results.jsonl"
  IFS=, read -r -a counts <<<"${NODES:-0,50,200,1000}"
  for nodes in "${counts[@]}"; do
    BATON_UP_ARGS="--config $models/baton.yaml" start_baton_up "$build" "$models/small"
    router_pid="$(pgrep -f -- "baton-router --model $models/small" | head -n 1)"
    "$build/bench/baton_registry_grpc_bench" --registry "$(cat "$work/data/run/router-internal.addr")" \
      --router "$addr" --tls-dir "$work/data/tls" --model "$models/small" --router-pid "$router_pid" \
      --nodes "$nodes" --seconds "${SECONDS_PER_COUNT:-10}" \
      --requests-per-s "${REQUESTS_PER_S:-10}" >>"$results"
    stop_baton_up
  done
  /usr/bin/python3 - "$results" <<'PY'
import json, sys
print(f"{'nodes':>6s} {'hb/s':>6s} {'us/hb':>7s} {'hb cores':>8s} {'idle cores':>10s} {'us/req':>8s} {'RSS MiB':>8s} "
      f"{'TTFT p50':>9s} {'p99':>7s} {'with hb p50':>11s} {'p99':>7s}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['nodes']:6d} {r['heartbeats_per_s']:6.0f} {r['router_cpu_us_per_heartbeat']:7.1f} "
          f"{r['router_heartbeat_cores']:8.3f} {r['router_idle_cores_with_nodes']:10.3f} "
          f"{r['router_cpu_us_per_request']:8.1f} "
          f"{r['router_rss_mib']:8.1f} {r['ttft_ms_p50']:9.1f} {r['ttft_ms_p99']:7.1f} "
          f"{r['ttft_ms_p50_with_heartbeats']:11.1f} {r['ttft_ms_p99_with_heartbeats']:7.1f}"
          f"   ({r['requests_failed']} of {2 * r['requests']:.0f} requests failed, "
          f"{r['heartbeats_refused']} heartbeats refused{': ' + r['first_refusal'] if r['first_refusal'] else ''})")
PY
  rm -rf "$models"
  exit 0
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for lookup in ${LOOKUPS:-holders per-node}; do
  "$build/bench/baton_registry_bench" --nodes "${NODES:-50,200,1000}" --lookup "$lookup" \
    --seconds "${SECONDS_PER_COUNT:-5}" --blocks-per-node "${BLOCKS_PER_NODE:-4096}" \
    >>"$out" 2>/dev/null
done
# An older build in the same run: BEFORE_BUILD_DIR=<that build> (its own bench, its own index).
if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then
  "$BEFORE_BUILD_DIR/bench/baton_registry_bench" --nodes "${NODES:-50,200,1000}" \
    --seconds "${SECONDS_PER_COUNT:-5}" --blocks-per-node "${BLOCKS_PER_NODE:-4096}" \
    2>/dev/null | sed 's/^{/{"build":"before",/' >>"$out"
fi
/usr/bin/python3 - "$out" "${SECONDS_PER_COUNT:-5}" <<'PY'
import json, sys
seconds = float(sys.argv[2])
print(f"{'build, lookup':>16s} {'nodes':>6s} {'hb/s':>7s} {'us/hb':>7s} {'hb cores':>8s} {'us/req':>8s} "
      f"{'admit p50 ms':>12s} {'p99 ms':>8s} {'cpu p99 ms':>10s} {'steal %':>7s} {'index MiB':>9s}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    label = r.get('build', 'this') + ', ' + r.get('lookup', '')
    print(f"{label:>16s} {r['nodes']:6d} {r['heartbeats'] / seconds:7.0f} {r['cpu_us_per_heartbeat']:7.1f} "
          f"{r['heartbeat_cpu_cores']:8.3f} {r['cpu_us_per_request']:8.1f} "
          f"{r['admit_ms_p50']:12.3f} {r['admit_ms_p99']:8.3f} "
          f"{r.get('admit_cpu_ms_p99', float('nan')):10.3f} {100 * r.get('steal_fraction', float('nan')):7.2f} "
          f"{r['rss_mib_nodes_and_indexes']:9.1f}"
          f"   ({r['heartbeats']} of {r['heartbeats_asked']:.0f} heartbeats, "
          f"{r['requests']} of {r['requests_asked']:.0f} requests)")
PY
