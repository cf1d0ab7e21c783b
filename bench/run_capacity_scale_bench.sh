#!/usr/bin/env bash
# The planner at scale: `batonctl capacity` on the Mooncake trace tiled TILES times
# (bench/tile_trace.py) and packed into the trace's own span (--time-scale 1/TILES: TILES times
# its load, so the answer grows with TILES; about 35 prefill nodes a tile at the default rates),
# with the small preset model, 512 MiB block caches, up to MAX_NODES nodes a role. Prints each
# build's wall seconds, peak memory, the points it ran and its answer, so two builds can be
# compared in one run: BASE=path/to/an/older/batonctl runs it first, then this build's, ROUNDS
# times (default 1). THREADS sets --threads (default 1; a BASE without the flag takes none).
# LOAD packs the tiles at LOAD times the trace's load instead (--time-scale 1/LOAD): TILES=250
# LOAD=16 is a million requests whose answer is about 1,000 prefill nodes. BLOCK_SIZE and
# SAMPLE_ONE_IN pass --block-size and --sample-one-in (this build only).
#
#   [TILES=5] [LOAD=TILES] [TTFT_P99_MS=90000] [ITL_P99_MS=200] [MAX_NODES=1024] [THREADS=1]
#     [BLOCK_SIZE=...] [SAMPLE_ONE_IN=...] [BASE=... [ROUNDS=1]] bench/run_capacity_scale_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
batonctl="${BATONCTL:-$root/build/tools/batonctl}"
tiles="${TILES:-5}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$batonctl" make-model --preset small --out "$work/model" >/dev/null
python3 "$root/bench/tile_trace.py" "$root/../shared/traces/mooncake_synthetic_trace.jsonl" "$tiles" \
  "$work/trace.jsonl"
scale="$(python3 -c "print(1 / ${LOAD:-$tiles})")"
echo "trace: $(wc -l <"$work/trace.jsonl") requests ($tiles tiles at --time-scale $scale)"

run() {
  local name="$1" binary="$2"
  shift 2
  /usr/bin/time -f "%e %M" -o "$work/time" "$binary" capacity --trace "$work/trace.jsonl" \
    --model-config "$work/model/config.json" --ttft-p99-ms "${TTFT_P99_MS:-90000}" \
    --itl-p99-ms "${ITL_P99_MS:-200}" --time-scale "$scale" --max-nodes "${MAX_NODES:-1024}" \
    --block-cache-bytes 512MiB --json "$@" >"$work/out.json" || true
  read -r seconds kib < <(tail -n 1 "$work/time")
  python3 - "$work/out.json" "$name" "$seconds" "$kib" <<'PY'
import json, sys
out, name, seconds, kib = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
doc = json.load(open(out))
best = doc["best"]
points = doc["explored"]
answer = ("none" if best is None else
          f"{best['prefill_nodes']} prefill + {best['decode_nodes']} decode "
          f"(TTFT p99 {best['ttft_ms']['p99']:.0f} ms, ITL p99 {best['itl_ms']['p99']:.1f} ms)")
full = sum(1 for p in points if not p["stopped"])
whole = [p for p in points if p.get("sample_one_in", 1) == 1]
print(f"{name}: {seconds:.1f} s, {kib / 1048576:.2f} GiB peak; {len(points)} points "
      f"({full} run to the end, {len(whole)} on the whole trace taking "
      f"{sum(p['seconds'] for p in whole):.1f} s); {answer}")
PY
}

flags=(--threads "${THREADS:-1}")
if [[ -n "${BLOCK_SIZE:-}" ]]; then flags+=(--block-size "$BLOCK_SIZE"); fi
if [[ -n "${SAMPLE_ONE_IN:-}" ]]; then flags+=(--sample-one-in "$SAMPLE_ONE_IN"); fi
for ((round = 0; round < ${ROUNDS:-1}; ++round)); do
  if [[ -n "${BASE:-}" ]]; then run base "$BASE"; fi
  run this "$batonctl" "${flags[@]}"
done
