#!/usr/bin/env bash
# The prefix store as a fleet (docs/architecture.md, "The store as a fleet"), on the small
# preset through `baton up`, in two parts:
#
# 1. Throughput with 1, 2 and 4 store nodes (R = 1): baton_store_fleet_bench's lookups/s (each a
#    parallel probe of a BLOCKS-block chain's keys on their owners), with the probes coalesced
#    per node as the router sends them (kvstore/probe_batcher.h) and, for the ratio, one call
#    per lookup and owner as before; and block-KV read MiB/s (each block from one owner); under
#    CLIENTS concurrent clients, each as a ratio to one node, with each store node's CPU time
#    per lookup and per MiB read (utime + stime from /proc over each load alone).
# 2. A store node lost: the Mooncake trace's first N requests, then its next N, through
#    `batonctl replay` on 3 store nodes (no local block cache, so every hit is the store's),
#    for R = 1 and R = 2; in one run of each kvstore-1 is stopped (SIGSTOP) between the halves.
#    The second half's token hit rate with the node lost, against the same half with none lost.
#
#   [CLIENTS=64] [BLOCKS=128] [SECONDS_PER_LOAD=5] [N=100] [LENGTH_SCALE=0.0625]
#   bench/run_store_fleet_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
trace="${TRACE:-$root/../shared/traces/mooncake_synthetic_trace.jsonl}"
clients="${CLIENTS:-64}" blocks="${BLOCKS:-128}" seconds="${SECONDS_PER_LOAD:-5}"
n="${N:-100}" length_scale="${LENGTH_SCALE:-0.0625}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
"$build/tools/batonctl" make-model --preset small --out "$out/small" >/dev/null

store_names() {  # store_names N: kvstore kvstore-1 ...
  local i
  echo -n kvstore
  for ((i = 1; i < $1; i++)); do echo -n " kvstore-$i"; done
}
store_pid() { pgrep -f -- "--node-id $1 --data-dir" | head -n 1; }

# --- 1: throughput ----------------------------------------------------------------------------
for nodes in 1 2 4; do
  BATON_UP_ARGS="--kvstore-nodes $nodes --block-cache-bytes 0" start_baton_up "$build" "$out/small"
  stores=""
  for name in $(store_names "$nodes"); do
    stores+="${stores:+,}$name=$(cat "$work/data/run/$name.addr")"
  done
  pids=""
  for name in $(store_names "$nodes"); do pids+="${pids:+,}$(store_pid "$name")"; done
  for load in per-lookup coalesced reads; do
    if [[ $load == reads ]]; then what=(--load reads); else what=(--load lookups --probes "$load"); fi
    "$build/bench/baton_store_fleet_bench" --stores "$stores" --store-pids "$pids" \
      --tls-dir "$work/data/tls" --model "$out/small" "${what[@]}" --clients "$clients" \
      --blocks "$blocks" --chains 8 --seconds "$seconds" >"$out/fleet-$nodes-$load.json"
  done
  stop_baton_up
done

# --- 2: a store node lost ---------------------------------------------------------------------
head -n "$n" "$trace" >"$out/first.jsonl"
sed -n "$((n + 1)),$((2 * n))p" "$trace" >"$out/second.jsonl"
replay() {  # replay TRACE OUT
  "$build/tools/batonctl" replay --trace "$1" --addr "$addr" --length-scale "$length_scale" \
    --time-scale 0 --max-output-tokens 4 --concurrency 8 --no-progress --json >"$2"
}
for r in 1 2; do
  for lost in none kvstore-1; do
    BATON_UP_ARGS="--kvstore-nodes 3 --kvstore-replication $r --block-cache-bytes 0" \
      start_baton_up "$build" "$out/small"
    replay "$out/first.jsonl" "$out/replay-$r-$lost-first.json"
    pid=""
    if [[ $lost != none ]]; then
      pid="$(store_pid "$lost")"
      kill -STOP "$pid"
      # The routers drop it from the live set once it misses its heartbeats (node TTL).
      for _ in $(seq 300); do
        live="$(curl -s "http://$(cat "$work/data/run/router.metrics")/metrics" |
          awk '$1 == "baton_kvstore_nodes" {print $2}')"
        [[ "$live" == 2 ]] && break
        sleep 0.1
      done
    fi
    replay "$out/second.jsonl" "$out/replay-$r-$lost-second.json"
    [[ -n "$pid" ]] && kill -CONT "$pid"
    stop_baton_up
  done
done

/usr/bin/python3 - "$out" "$clients" "$blocks" <<'PY'
import json, sys
out, clients, blocks = sys.argv[1], sys.argv[2], sys.argv[3]
def load(nodes, what):
    return json.load(open(f"{out}/fleet-{nodes}-{what}.json"))
def per_node_ms(run, cpu_key, count):  # mean store node's CPU ms per operation
    cpu = run[cpu_key]
    return 1000 * sum(cpu.values()) / len(cpu) / count
print(f"lookups, {clients} clients, {blocks}-block chains (R = 1); ratios to one store node, "
      "and coalesced to per-lookup in the same cluster")
print(f"{'nodes':>5s} {'probes':>10s} {'lookups/s':>10s} {'ratio':>6s} {'lookups/call':>12s} "
      f"{'CPU ms/lookup/node':>19s} {'ratio':>6s} {'vs per-lookup':>13s}")
base = {}
for nodes in (1, 2, 4):
    row = {}
    for probes in ("per-lookup", "coalesced"):
        run = load(nodes, probes)
        lookups = run["lookups_per_s"] * run["lookup_seconds"]
        calls = run["probes_per_s"] * run["lookup_seconds"]
        ms = per_node_ms(run, "lookup_cpu_s_by_node", lookups)
        if nodes == 1:
            base[probes] = (run["lookups_per_s"], ms)
        row[probes] = ms
        print(f"{nodes:5d} {probes:>10s} {run['lookups_per_s']:10.1f} "
              f"{run['lookups_per_s'] / base[probes][0]:6.2f} {nodes * lookups / calls:12.2f} "
              f"{ms:19.4f} {ms / base[probes][1]:6.2f} "
              f"{row[probes] / row['per-lookup']:13.2f}   (failures {run['lookup_failures']})")
print()
print(f"block-KV reads, {clients} clients (R = 1), ratios to one store node")
print(f"{'nodes':>5s} {'read MiB/s':>10s} {'ratio':>6s} {'CPU ms/MiB/node':>16s} {'ratio':>6s}")
for nodes in (1, 2, 4):
    run = load(nodes, "reads")
    mib = run["read_mib_per_s"] * run["read_seconds"]
    ms = per_node_ms(run, "read_cpu_s_by_node", mib)
    if nodes == 1:
        base["reads"] = (run["read_mib_per_s"], ms)
    print(f"{nodes:5d} {run['read_mib_per_s']:10.1f} {run['read_mib_per_s'] / base['reads'][0]:6.2f} "
          f"{ms:16.3f} {ms / base['reads'][1]:6.2f}   (failures {run['read_failures']})")
print()
print("token hit rate on 3 store nodes: the trace's second half, kvstore-1 lost between the halves")
print(f"{'R':>2s} {'first half':>10s} {'second, none lost':>18s} {'second, one lost':>17s} {'ratio':>6s}")
for r in (1, 2):
    first = json.load(open(f"{out}/replay-{r}-none-first.json"))["token_hit_rate"]
    kept = json.load(open(f"{out}/replay-{r}-none-second.json"))["token_hit_rate"]
    lost = json.load(open(f"{out}/replay-{r}-kvstore-1-second.json"))
    print(f"{r:2d} {first:10.3f} {kept:18.3f} {lost['token_hit_rate']:17.3f} "
          f"{lost['token_hit_rate'] / kept if kept else float('nan'):6.3f}"
          f"   ({lost['completed']} of {lost['requests']} completed)")
PY
rm -rf "$out"
