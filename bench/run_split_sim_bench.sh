#!/usr/bin/env bash
# The two splits on the Mooncake conversation trace, measured and simulated in one run: for
# prefill-all and replay-on-decode, bench/run_policy_bench.sh with 1 prefill and 1 decode node
# and predicted-ttft routing (a fresh `baton up --split S` replays the first N requests of the
# trace; `batonctl rates --addr` reads what the nodes measured; `batonctl simulate` runs the
# same requests at those rates). Prints TTFT and ITL p50/p99 measured and simulated per split,
# and each simulated figure over the measured one.
#
#   [N=150] [LENGTH_SCALE=0.0625] [TIME_SCALE=2] bench/run_split_sim_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for split in prefill-all replay-on-decode; do
  SPLIT="$split" PREFILL_NODES=1 DECODE_NODES=1 POLICIES=predicted-ttft \
    bash "$root/bench/run_policy_bench.sh"
done
