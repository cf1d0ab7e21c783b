#!/usr/bin/env bash
# StateBlock transfer figures in one run: baton's pull path (the decode side's UCX get of a
# StateBlock staged for it, and the gRPC transport's ReadRegions) between two processes, beside
# `ucx_perftest -t ucp_get` (ucp_get_bw in newer UCX) and `-t ucp_put_bw` at the same sizes on
# the same transports (loopback; UCX picks shared memory between processes). Shared machines
# are noisy, so baton and ucp_get alternate for ROUNDS rounds and the table gives medians (and
# the spread of the per-round ratio); gRPC and ucp_put_bw run in the first round.
#
#   bench/run_transfer_bench.sh        (SIZES=1,16,256 ITERATIONS=50 ROUNDS=5 by default)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
sizes="${SIZES:-1,16,256}"
iterations="${ITERATIONS:-50}"
rounds="${ROUNDS:-5}"
"$build/bench/baton_transfer_bench" --expose "$work/exposures.json" --sizes "$sizes" \
  --iterations "$iterations" >"$work/expose.log" 2>&1 &
pids+=($!)
port=13400
perftest() {  # perftest TEST MIB: MiB/s
  ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s $(($2 << 20)) -n "$iterations" -w 2 \
    | awk '/Final:/ {print $6}'
  wait "$server" || true
  port=$((port + 1))
}
for round in $(seq "$rounds"); do
  extra=()
  [[ "$round" == 1 ]] || extra=(--no-grpc)
  "$build/bench/baton_transfer_bench" --read "$work/exposures.json" --sizes "$sizes" \
    --iterations "$iterations" "${extra[@]}" >"$work/baton.$round.json"
  for mib in ${sizes//,/ }; do
    echo "$round $mib get $(perftest ucp_get "$mib")" >>"$work/perftest.txt"
    [[ "$round" == 1 ]] && echo "$round $mib put $(perftest ucp_put_bw "$mib")" >>"$work/perftest.txt"
  done
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{work}/baton.{r}.json")) for r in range(1, rounds + 1)]
perf = {}
for line in open(f"{work}/perftest.txt"):
    r, mib, test, rate = line.split()
    perf.setdefault((int(mib), test), {})[int(r)] = float(rate)
print(f"{rounds} rounds; medians in MiB/s; UCX/get is the median of the per-round ratios [min, max]")
print("size MiB  baton UCX get  perftest get  UCX/get [min, max]  perftest put  baton gRPC  "
      "UCX/gRPC  expose ms (per request / reused)")
for i, row in enumerate(runs[0]):
    mib = row["size_mib"]
    ucx = [run[i]["ucx_mib_per_s"] for run in runs]
    get = [perf[(mib, "get")][r] for r in range(1, rounds + 1)]
    ratios = [u / g for u, g in zip(ucx, get)]
    put = perf[(mib, "put")][1]
    grpc = row["grpc_mib_per_s"]
    print(f"{mib:8d}  {statistics.median(ucx):13.0f}  {statistics.median(get):12.0f}  "
          f"{statistics.median(ratios):7.2f} [{min(ratios):.2f}, {max(ratios):.2f}]  "
          f"{put:12.0f}  {grpc:10.0f}  {ucx[0] / grpc:8.2f}  "
          f"{row['expose_ms']:9.2f} / {row['expose_reused_ms']:.2f}")
PY
