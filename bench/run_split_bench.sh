#!/usr/bin/env bash
# The two splits side by side through `baton up` (one prefill and one decode node) on the small
# preset unless MODEL_DIR is given: the prefill node's resident weight bytes (its metrics) and
# peak RSS (VmHWM), prefill tokens/s of one cold 4K prompt (LONE_LEN), and what 16 prompts of
# 2K tokens arriving
# at once do to 8 streams already decoding (bench/arrival_bench.cc): the arrivals' TTFT p50/p99
# and the running streams' ITL p99 in a quiet window and during the arrivals. Replay-on-decode
# runs at two --replay-rows-per-step settings (ROWS, default "8 64"), each within
# --replay-step-budget REPLAY_STEP_BUDGET (default: baton-decode's). StateBlock bytes per
# request come from `batonctl plan` at L = 1K, 4K, 16K under the serving default (compact,
# K = C).
#
#   bench/run_split_bench.sh [MODEL_DIR]
#       (ARRIVALS=16 ARRIVAL_LEN=2048 RUNNING=8 RUNNING_TOKENS=2000 ROWS="8 64"; a model of 512
#       positions, like the trained ones, needs e.g. LONE_LEN=448 ARRIVAL_LEN=400 RUNNING_PROMPT_LEN=16
#       RUNNING_TOKENS=480 QUIET_MS=150: its streams decode fast enough to finish otherwise)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
source "$root/bench/baton_up.sh"
out="$(mktemp -d)"
model="${1:-}"
if [[ -z "$model" ]]; then
  model="$out/model"
  "$build/tools/batonctl" make-model --preset small --seed 0 --out "$model" >/dev/null
fi

# StateBlock bytes per request (no server needed), at K = C = W + max_backtrack + 1.
read -r W C < <(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]));
print(c["sliding_window"], c["sliding_window"] + c.get("max_backtrack", 5) + 1)' "$model/config.json")
for L in 1024 4096 16384; do
  "$build/tools/batonctl" plan --prompt-len "$L" --window "$W" --mode compact --keep "$C" \
    --json --model-config "$model/config.json" >"$out/plan.$L.json"
done

run() {  # LABEL SPLIT ROWS
  local label="$1" split="$2" rows="$3"
  local budget=()
  if [[ -n "${REPLAY_STEP_BUDGET:-}" ]]; then budget=(--replay-step-budget "$REPLAY_STEP_BUDGET"); fi
  BATON_UP_ARGS="--split $split --replay-rows-per-step $rows ${budget[*]}" \
    start_baton_up "$build" "$model"
  "$build/bench/baton_arrival_bench" --addr "$addr" --running "${RUNNING:-8}" \
    --running-tokens "${RUNNING_TOKENS:-2000}" --running-prompt-len "${RUNNING_PROMPT_LEN:-64}" \
    --quiet-ms "${QUIET_MS:-1500}" --arrivals "${ARRIVALS:-16}" --lone-prompt-len "${LONE_LEN:-4096}" \
    --arrival-prompt-len "${ARRIVAL_LEN:-2048}" >"$out/$label.json"
  local pid
  pid="$(pgrep -n baton-prefill || true)"
  echo "{\"vmhwm_kb\": $(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)," \
    "\"weight_bytes\": $("$build/tools/batonctl" models --addr "$addr" |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["models"][0]["prefill_weight_bytes"])')}" \
    >"$out/$label.node.json"
  stop_baton_up
}
run prefill-all prefill-all 8
for rows in ${ROWS:-8 64}; do run "replay-$rows" replay-on-decode "$rows"; done

/usr/bin/python3 - "$out" ${ROWS:-8 64} <<'PY'
import json, sys
out, rows = sys.argv[1], sys.argv[2:]
labels = ["prefill-all"] + [f"replay-{r}" for r in rows]
base = json.load(open(f"{out}/prefill-all.json"))
base_node = json.load(open(f"{out}/prefill-all.node.json"))
print(f"{'run':<14} {'weights MB':>10} {'/all':>6} {'RSS MB':>8} {'prefill tok/s':>13} "
      f"{'TTFT p50':>9} {'TTFT p99':>9} {'ITL p99 quiet':>13} {'ITL p99 arr':>11} {'ratio':>6}")
for label in labels:
    r = json.load(open(f"{out}/{label}.json"))
    n = json.load(open(f"{out}/{label}.node.json"))
    w = float(n.get("weight_bytes") or 0)
    bw = float(base_node.get("weight_bytes") or 1)
    print(f"{label:<14} {w/1e6:>10.1f} {w/bw:>6.3f} {n['vmhwm_kb']/1024:>8.0f} "
          f"{r['prefill_tokens_per_s']:>13.0f} {r['ttft_ms']['p50']:>9.0f} {r['ttft_ms']['p99']:>9.0f} "
          f"{r['itl_ms_quiet']['p99']:>13.1f} {r['itl_ms_arrivals']['p99']:>11.1f} "
          f"{r['itl_p99_ratio']:>6.2f}")
print()
print(f"{'L':>6} {'prefill-all bytes':>18} {'replay-on-decode bytes':>23} {'ratio':>6}")
for L in (1024, 4096, 16384):
    p = json.load(open(f"{out}/plan.{L}.json"))
    a, b = p["state_block_bytes"]["total"], p["replay_on_decode_state_block_bytes"]["total"]
    print(f"{L:>6} {a:>18} {b:>23} {b/a:>6.3f}")
PY
