#!/usr/bin/env bash
# Load figures through `baton up` (one prefill and one decode node, its defaults) on the small
# preset unless MODEL_DIR is given: throughput and TTFT/ITL p50/p99 at 64 and 256 concurrent
# streams (one request each: 128-token prompts, 8 tokens), and goodput at a fixed request rate
# (RATE requests/s, RATE_REQUESTS of them; the share of all requests sent that complete with
# TTFT <= 2 s and every inter-token gap <= 200 ms, DistServe's measure).
#
# BEFORE_BUILD_DIR=<another build> measures that build first with the same command and the
# same model, then this one, and prints both and the after/before ratios: the before/after
# comparison in one run (build an older commit with `git worktree add /tmp/old <commit>` and
# `cmake -G Ninja -S /tmp/old -B /tmp/old/build && cmake --build /tmp/old/build --target baton
# baton-router baton-prefill baton-decode baton-kvstore`). ROUNDS=N repeats the pair N times
# (before after before after ...), so that the machine's drift shows beside the difference.
#
#   bench/run_load_bench.sh [MODEL_DIR]      (STREAMS=64,256 RATE=2 RATE_REQUESTS=48 ROUNDS=1)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
bench="${BENCH_BUILD_DIR:-$root/build}/bench/baton_serving_bench"
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
model="${1:-}"
if [[ -z "$model" ]]; then
  model="$out/model"
  "$root/build/tools/batonctl" make-model --preset small --seed 0 --out "$model" >/dev/null
fi

labels=()
for ((round = 1; round <= ${ROUNDS:-1}; ++round)); do
  suffix=""
  ((round > 1)) && suffix="-$round"
  if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then labels+=("before$suffix"); fi
  labels+=("after$suffix")
done
for label in "${labels[@]}"; do
  dir="$build"
  [[ "$label" == before* ]] && dir="$BEFORE_BUILD_DIR"
  start_baton_up "$dir" "$model"
  "$bench" --addr "$addr" --concurrency "${STREAMS:-64,256}" --requests 1 --prompt-len 128 \
    --max-tokens 8 >"$out/$label.streams.json"
  "$bench" --addr "$addr" --rate "${RATE:-2}" --rate-requests "${RATE_REQUESTS:-48}" \
    --prompt-len 128 --max-tokens 8 >"$out/$label.rate.json"
  stop_baton_up
done
/usr/bin/python3 - "$out" "${labels[@]}" <<'PY'
import json, sys
out, labels = sys.argv[1], sys.argv[2:]
streams = {l: json.load(open(f"{out}/{l}.streams.json")) for l in labels}
rate = {l: json.load(open(f"{out}/{l}.rate.json")) for l in labels}
print("build   streams  errors  TTFT p50/p99 ms      ITL p50/p99 ms    out tok/s")
for l in labels:
    for r in streams[l]:
        t, i = r["ttft_ms"], r["itl_ms"]
        print(f"{l:6s}  {r['streams']:7d}  {r['errors']:6d}  {t['p50']:8.1f} {t['p99']:8.1f}   "
              f"{i['p50']:6.1f} {i['p99']:7.1f}   {r['output_tokens_per_s']:8.1f}")
for l in labels:
    for r in rate[l]:
        t, i = r["ttft_ms"], r["itl_ms"]
        print(f"{l}: rate {r['rate']}/s, {r['requests']} requests: errors {r['errors']}, goodput "
              f"{r['goodput']:.3f}, TTFT p50/p99 {t['p50']:.1f}/{t['p99']:.1f} ms, ITL p50/p99 "
              f"{i['p50']:.1f}/{i['p99']:.1f} ms")
for b, a in zip(labels[0::2], labels[1::2]):
    if not (b.startswith("before") and a.startswith("after")):
        break
    print(f"{a} against {b}:")
    for rb, ra in zip(streams[b], streams[a]):
        ratio = ra["output_tokens_per_s"] / rb["output_tokens_per_s"] if rb["output_tokens_per_s"] else float("inf")
        print(f"{ra['streams']} streams: completed {rb['streams'] - rb['errors']} -> "
              f"{ra['streams'] - ra['errors']}, output tok/s after/before {ratio:.2f}")
    for rb, ra in zip(rate[b], rate[a]):
        print(f"goodput at {ra['rate']}/s: before {rb['goodput']:.3f}, after {ra['goodput']:.3f}")
PY
rm -rf "$out"
