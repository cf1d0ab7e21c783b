#!/usr/bin/env bash
# StateBlock transfer figures in one run: baton's UCX path (put + flush of every block-KV page
# into a running baton-decode) and its gRPC transport, beside `ucx_perftest -t ucp_put_bw` and
# `-t ucp_get` (ucp_get_bw in newer UCX) at the same sizes on the same transports (loopback; UCX
# picks shared memory between processes).
#
#   bench/run_transfer_bench.sh [MODEL_DIR]     (default: a small preset model in a temp dir)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
model="${1:-$work/small}"
[[ -f "$model/config.json" ]] || "$build/tools/batonctl" make-model --preset small --out "$model" >/dev/null
sizes="${SIZES:-1,16,256}"
iterations="${ITERATIONS:-10}"
"$build/decode_node/baton-decode" --model "$model" --pages 1100 --slots 4 --insecure-internal \
  --ready-file "$work/decode.addr" >"$work/decode.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [[ -s "$work/decode.addr" ]] && break; sleep 0.1; done
"$build/bench/baton_transfer_bench" --model "$model" --decode "$(cat "$work/decode.addr")" \
  --sizes "$sizes" --iterations "$iterations" >"$work/baton.json"
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
print("size MiB  baton UCX MiB/s  perftest put MiB/s  UCX/put  perftest get MiB/s  UCX/get  "
      "baton gRPC MiB/s  UCX/gRPC")
for row in baton:
    put, get = perf.get(row["size_mib"], (float("nan"), float("nan")))
    ucx = row["ucx_mib_per_s"]
    print(f"{row['size_mib']:8d}  {ucx:15.0f}  {put:18.0f}  {ucx / put:7.2f}  {get:18.0f}  "
          f"{ucx / get:7.2f}  {row['grpc_mib_per_s']:16.0f}  {ucx / row['grpc_mib_per_s']:8.2f}")
PY
