#!/usr/bin/env bash
# The fidelity study of docs/fidelity.md, on the trained models in models/ and their
# held-out Brown text: `batonctl eval` (perplexity with truncation off, compact at K = C, mask at
# 2C, compact at 2C and at R) and `batonctl approx-error --text` (KL, top-1 agreement and
# max |dlogit| against K, cold and after the prefix hit the ring cap allows, per step and so
# against the distance from the retained region's edge), then `batonctl report` for the plots.
#
#   tools/train/fidelity.sh [BUILD_DIR] [OUT_DIR]      # defaults: build, docs/fidelity
#
# Writes OUT_DIR/eval-<model>.jsonl, OUT_DIR/approx-<model>.json, OUT_DIR/report.md with its
# PNGs, and prints a summary table. Takes a few minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/docs/fidelity}"
batonctl="$build/tools/batonctl"
mkdir -p "$out"

# Windows of 448 tokens (384 prompt + 64 steps) fit the models' 512 positions.
prompts="${FIDELITY_PROMPTS:-48}"
# ced-brown-shared (one block-KV source, tools/train/train_models.sh) where it has been trained.
models=(ced-brown-plain ced-brown-replay)
if [[ -d "$root/models/ced-brown-shared" ]]; then models+=(ced-brown-shared); fi
for model in "${models[@]}"; do
  dir="$root/models/$model"
  # C = W + max_backtrack + 1, R = W + (D - 1)(W - 1), from the model's config.
  read -r C R < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
W, D = c["sliding_window"], c["num_hidden_layers"] - c["n_prefill_layer"]
print(W + c.get("max_backtrack", 5) + 1, W + (D - 1) * (W - 1))' "$dir/config.json")
  : >"$out/eval-$model.jsonl"
  for setting in "off 0" "compact $C" "mask $((2 * C))" "compact $((2 * C))" "compact $R"; do
    read -r mode keep <<<"$setting"
    "$batonctl" eval --model "$dir" --text "$dir/heldout.txt" --mode "$mode" --keep "$keep" \
      --json >>"$out/eval-$model.jsonl"
  done
  "$batonctl" approx-error --model "$dir" --text "$dir/heldout.txt" --num-prompts "$prompts" \
    --prompt-len 384 --steps 64 --keep "$C,100,$((2 * C)),200,$R" --json \
    >"$out/approx-$model.json"
done
approx=()
for model in "${models[@]}"; do approx+=("$out/approx-$model.json"); done
"$batonctl" report --out "$out" "${approx[@]}" >/dev/null

python3 - "$out" "${models[@]}" <<'EOF'
import json, sys
out, models = sys.argv[1], sys.argv[2:]
print("perplexity on the held-out text (tokens after each window's 256-token prompt)")
for model in models:
    for line in open(f"{out}/eval-{model}.jsonl"):
        e = json.loads(line)
        print(f"  {model:18s} {e['mode']:8s} K={e['keep']:<4d} nll {e['nll']:.4f} "
              f"perplexity {e['perplexity']:.3f}")
print("approx-error (mean over prompts and 64 teacher-forced steps)")
for model in models:
    report = json.load(open(f"{out}/approx-{model}.json"))
    for r in report["results"]:
        print(f"  {model:18s} {r['mode']:8s} K={r['keep']:<4d} H={r['prefix_hit_tokens']:<4d} "
              f"KL {r['kl_mean']:.3e} top-1 {r['top1_agreement']:.4f} "
              f"max|dlogit| {r['max_abs_logit_diff']:.3e}")
EOF
