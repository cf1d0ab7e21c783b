#!/usr/bin/env bash
# Speculative decoding against off through `baton up` (bench/speculative_bench.cc): decode
# tokens/s per stream and ITL p50/p99 at batch 1 and 8, for a repetitive workload ("repeat the
# passage") and held-out Brown text, on the trained model with its draft (methods off, ngram,
# draft) and on the small preset (off, ngram: random weights have no draft model to pair with).
#
#   bench/run_speculative_bench.sh    (ROUNDS=8 MAX_TOKENS=320 BATCHES=1,8; the small preset
#                                      runs SMALL_ROUNDS=3 of SMALL_MAX_TOKENS=128)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
source "$root/bench/baton_up.sh"
text="$root/models/ced-brown-shared/heldout.txt"
bench=("$build/bench/baton_speculative_bench" --text "$text" --batches "${BATCHES:-1,8}")

echo "== trained model (ced-brown-shared, draft ced-brown-draft)" >&2
BATON_UP_ARGS="--speculative draft:$root/models/ced-brown-draft" \
  start_baton_up "$build" "$root/models/ced-brown-shared"
"${bench[@]}" --addr "$addr" --methods off,ngram,draft --rounds "${ROUNDS:-8}" \
  --max-tokens "${MAX_TOKENS:-320}"
stop_baton_up

echo "== small preset" >&2
BATON_UP_ARGS="--speculative ngram" start_baton_up "$build"
"${bench[@]}" --addr "$addr" --methods off,ngram --rounds "${SMALL_ROUNDS:-3}" \
  --max-tokens "${SMALL_MAX_TOKENS:-128}"
stop_baton_up
