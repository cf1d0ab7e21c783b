#!/usr/bin/env bash
# The prefix store as a fleet (docs/architecture.md, "The store as a fleet"), on the small
# preset through `baton up`, in two parts:
#
# 1. Throughput with 1, 2 and 4 store nodes (R = 1): baton_store_fleet_bench's lookups/s (each a
#    parallel probe of a 16-block chain's keys on their owners) and block-KV read MiB/s (each
#    block from one owner) under CLIENTS concurrent clients, each as a ratio to one node, and
#    each store node's CPU time per lookup and per MiB read (utime + stime from /proc over
#    each load).
# 2. A store node lost: the Mooncake trace's first N requests, then its next N, through
#    `batonctl replay` on 3 store nodes (no local block cache, so every hit is the store's),
#    for R = 1 and R = 2; in one run of each kvstore-1 is stopped (SIGSTOP) between the halves.
#    The second half's token hit rate with the node lost, against the same half with none lost.
#
#   [CLIENTS=16] [SECONDS_PER_LOAD=5] [N=100] [LENGTH_SCALE=0.0625] bench/run_store_fleet_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
trace="${TRACE:-$root/../shared/traces/mooncake_synthetic_trace.jsonl}"
clients="${CLIENTS:-16}" seconds="${SECONDS_PER_LOAD:-5}"
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
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# --- 1: throughput ----------------------------------------------------------------------------
for nodes in 1 2 4; do
  BATON_UP_ARGS="--kvstore-nodes $nodes --block-cache-bytes 0" start_baton_up "$build" "$out/small"
  stores=""
  for name in $(store_names "$nodes"); do
    stores+="${stores:+,}$name=$(cat "$work/data/run/$name.addr")"
  done
  for load in lookups reads; do
    declare -A before=()
    for name in $(store_names "$nodes"); do before[$name]="$(cpu_ticks "$(store_pid "$name")")"; done
    "$build/bench/baton_store_fleet_bench" --stores "$stores" --tls-dir "$work/data/tls" \
      --model "$out/small" --load "$load" --clients "$clients" --seconds "$seconds" \
      >"$out/fleet-$nodes-$load.json"
    for name in $(store_names "$nodes"); do
      echo "$name $(($(cpu_ticks "$(store_pid "$name")") - before[$name]))"
    done >"$out/cpu-$nodes-$load.txt"
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

/usr/bin/python3 - "$out" "$clients" <<'PY'
import json, os, sys
out, clients = sys.argv[1], sys.argv[2]
hz = os.sysconf("SC_CLK_TCK")
def cpu(nodes, load):
    return {l.split()[0]: int(l.split()[1]) / hz for l in open(f"{out}/cpu-{nodes}-{load}.txt")}
one = {load: json.load(open(f"{out}/fleet-1-{load}.json")) for load in ("lookups", "reads")}
print(f"throughput, {clients} clients (R = 1), ratios to one store node")
print(f"{'nodes':>5s} {'lookups/s':>10s} {'ratio':>6s} {'CPU ms/lookup/node':>19s} {'ratio':>6s} "
      f"{'read MiB/s':>10s} {'ratio':>6s} {'CPU ms/MiB/node':>16s} {'ratio':>6s}")
base = {}
for nodes in (1, 2, 4):
    look = json.load(open(f"{out}/fleet-{nodes}-lookups.json"))
    read = json.load(open(f"{out}/fleet-{nodes}-reads.json"))
    lookups = look["lookups_per_s"] * look["lookup_seconds"]
    mib = read["read_mib_per_s"] * read["read_seconds"]
    c_look = cpu(nodes, "lookups")
    c_read = cpu(nodes, "reads")
    per_lookup = 1000 * sum(c_look.values()) / len(c_look) / lookups
    per_mib = 1000 * sum(c_read.values()) / len(c_read) / mib
    if nodes == 1:
        base = {"l": look["lookups_per_s"], "r": read["read_mib_per_s"], "pl": per_lookup, "pm": per_mib}
    print(f"{nodes:5d} {look['lookups_per_s']:10.1f} {look['lookups_per_s'] / base['l']:6.2f} "
          f"{per_lookup:19.3f} {per_lookup / base['pl']:6.2f} {read['read_mib_per_s']:10.1f} "
          f"{read['read_mib_per_s'] / base['r']:6.2f} {per_mib:16.3f} {per_mib / base['pm']:6.2f}"
          f"   (failures {look['lookup_failures']} + {read['read_failures']})")
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
