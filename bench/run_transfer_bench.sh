#!/usr/bin/env bash
# StateBlock transfer figures in one run: baton's pull path between two processes, as the nodes
# move a StateBlock (the prefill side exposes staging memory, the decode side reads it into its
# own), over
#   - gRPC ReadRegions under mutual TLS (the chart's default across hosts without RDMA),
#   - UCX over TCP on loopback (accepted only with --ucx-allow-unprotected-tcp: it lets any peer
#     read and write a node's memory; here it is the baseline gRPC is held against),
#   - UCX over shared memory (UCX_TLS unset: baton's default, sm,self),
# beside `ucx_perftest -t ucp_get` on shared memory at the same sizes. Shared machines are
# noisy, so the readers alternate for ROUNDS rounds and the table gives medians, and the
# gRPC / UCX-TCP ratio per round (median [min, max]).
#
#   bench/run_transfer_bench.sh        (SIZES=1,16,256 ITERATIONS=20 ROUNDS=3 by default)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
bench="$build/bench/baton_transfer_bench"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
sizes="${SIZES:-1,16,256}"
iterations="${ITERATIONS:-20}"
rounds="${ROUNDS:-3}"
tcp=(env UCX_TLS=tcp UCX_NET_DEVICES=lo)
"$bench" --expose "$work/shm.json" --sizes "$sizes" --iterations "$iterations" --tls "$work/tls" \
  >"$work/expose-shm.log" 2>&1 &
pids+=($!)
"${tcp[@]}" "$bench" --expose "$work/tcp.json" --sizes "$sizes" --iterations "$iterations" \
  --ucx-allow-unprotected-tcp >"$work/expose-tcp.log" 2>&1 &
pids+=($!)
port=13400
perftest() {  # perftest MIB: MiB/s of ucp_get on shared memory
  ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -s $(($1 << 20)) -n "$iterations" -w 2 \
    | awk '/Final:/ {print $6}'
  wait "$server" || true
  port=$((port + 1))
}
for round in $(seq "$rounds"); do
  "$bench" --read "$work/shm.json" --sizes "$sizes" --iterations "$iterations" \
    --tls "$work/tls" >"$work/shm.$round.json"
  "${tcp[@]}" "$bench" --read "$work/tcp.json" --sizes "$sizes" --iterations "$iterations" \
    --no-grpc --ucx-allow-unprotected-tcp >"$work/tcp.$round.json"
  for mib in ${sizes//,/ }; do echo "$round $mib $(perftest "$mib")" >>"$work/perftest.txt"; done
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
shm = [json.load(open(f"{work}/shm.{r}.json")) for r in range(1, rounds + 1)]
tcp = [json.load(open(f"{work}/tcp.{r}.json")) for r in range(1, rounds + 1)]
perf = {}
for line in open(f"{work}/perftest.txt"):
    r, mib, rate = line.split()
    perf.setdefault(int(mib), []).append(float(rate))
med = statistics.median
print(f"{rounds} rounds; medians in MiB/s; gRPC/UCX-TCP is the median of the per-round ratios [min, max]")
print("size MiB  gRPC+mTLS  UCX TCP  gRPC/UCX-TCP [min, max]  UCX shm  perftest get shm  "
      "expose ms (per request / reused)")
for i, row in enumerate(shm[0]):
    mib = row["size_mib"]
    grpc = [run[i]["grpc_mib_per_s"] for run in shm]
    ucx_shm = [run[i]["ucx_mib_per_s"] for run in shm]
    ucx_tcp = [run[i]["ucx_mib_per_s"] for run in tcp]
    ratios = [g / t for g, t in zip(grpc, ucx_tcp)]
    print(f"{mib:8d}  {med(grpc):9.0f}  {med(ucx_tcp):7.0f}  {med(ratios):12.2f} "
          f"[{min(ratios):.2f}, {max(ratios):.2f}]  {med(ucx_shm):7.0f}  {med(perf[mib]):16.0f}  "
          f"{row['expose_ms']:9.2f} / {row['expose_reused_ms']:.2f}")
PY
