#!/usr/bin/env bash
# StateBlock transfer figures in one run: baton's pull path (the decode side's UCX get of a
# StateBlock exposed for it alone, and the gRPC transport's ReadRegions) between two processes,
# beside `ucx_perftest -t ucp_get` (ucp_get_bw in newer UCX) and `-t ucp_put_bw` at the same
# sizes on the same transports (loopback; UCX picks shared memory between processes).
#
#   bench/run_transfer_bench.sh        (SIZES=1,16,256 ITERATIONS=10 by default)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
sizes="${SIZES:-1,16,256}"
iterations="${ITERATIONS:-10}"
"$build/bench/baton_transfer_bench" --expose "$work/exposures.json" --sizes "$sizes" \
  --iterations "$iterations" >"$work/expose.log" 2>&1 &
pids+=($!)
"$build/bench/baton_transfer_bench" --read "$work/exposures.json" --sizes "$sizes" \
  --iterations "$iterations" >"$work/baton.json"
port=13400
for mib in ${sizes//,/ }; do
  # UCX 1.13 (Debian 12) names the get bandwidth test ucp_get; newer releases ucp_get_bw.
  for test in ucp_put_bw ucp_get; do
    ucx_perftest -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s $((mib << 20)) -n "$iterations" -w 2 \
      | awk -v mib="$mib" '/Final:/ {printf "%s ", $6}' >>"$work/perftest.txt"
    wait "$server" || true
    port=$((port + 1))
  done
  echo " $mib" >>"$work/perftest.txt"
done
/usr/bin/python3 - "$work/baton.json" "$work/perftest.txt" <<'PY'
import json, sys
baton = json.load(open(sys.argv[1]))
# perftest.txt: "<put MiB/s> <get MiB/s> <size MiB>" per line.
perf = {int(l.split()[2]): (float(l.split()[0]), float(l.split()[1]))
        for l in open(sys.argv[2]) if len(l.split()) == 3}
print("size MiB  baton UCX get MiB/s  perftest get MiB/s  UCX/get  perftest put MiB/s  "
      "baton gRPC MiB/s  UCX/gRPC  expose ms (per request / reused)")
for row in baton:
    put, get = perf.get(row["size_mib"], (float("nan"), float("nan")))
    ucx = row["ucx_mib_per_s"]
    print(f"{row['size_mib']:8d}  {ucx:19.0f}  {get:18.0f}  {ucx / get:7.2f}  {put:18.0f}  "
          f"{row['grpc_mib_per_s']:16.0f}  {ucx / row['grpc_mib_per_s']:8.2f}  "
          f"{row['expose_ms']:9.2f} / {row['expose_reused_ms']:.2f}")
PY
