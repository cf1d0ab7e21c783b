#!/usr/bin/env bash
# The fidelity study of docs/fidelity.md, on the trained models in models/ and their
# held-out Brown text: `batonctl eval` (perplexity with truncation off, compact at K = C, mask at
# 2C, compact at 2C and at R) and `batonctl approx-error --text` (KL, top-1 agreement and
# max |dlogit| against K, cold and after the prefix hit the ring cap allows, per step and so
# against the distance from the retained region's edge), `batonctl approx-error --free-running`
# (greedy completions of 256 tokens after 256-token prompts under each K against off's: the
# share identical, the share of positions that differ, where the first difference falls), then
# `batonctl report` for the plots.
#
#   tools/train/fidelity.sh [BUILD_DIR] [OUT_DIR]      # defaults: build, docs/fidelity
#
# Writes OUT_DIR/eval-<model>.jsonl, OUT_DIR/approx-<model>.json, OUT_DIR/free-<model>.json,
# OUT_DIR/report.md with its PNGs, and prints a summary table. Takes about 8 minutes on 2
# cores, 6 of them the free-running completions (FIDELITY_FREE_PROMPTS=0 skips them; fewer
# prompts loosen the bound: with no differing completion in N, 95% upper bound ~ 3/N).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/docs/fidelity}"
batonctl="$build/tools/batonctl"
mkdir -p "$out"

# Windows of 448 tokens (384 prompt + 64 steps) fit the models' 512 positions.
prompts="${FIDELITY_PROMPTS:-48}"
# Free-running: 256-token prompts, consecutive windows of the held-out text (330 of them, all
# it has), each completed with 256 greedy tokens: 512 positions.
free_prompts="${FIDELITY_FREE_PROMPTS:-330}"
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
  if ((free_prompts > 0)); then
    # One thread: as fast here as the team of two, and no step waits on a team thread that
    # another process has descheduled; docs/fidelity.md's figures come from this command.
    OMP_NUM_THREADS=1 "$batonctl" approx-error --free-running --model "$dir" --text "$dir/heldout.txt" \
      --num-prompts "$free_prompts" --prompt-len 256 --steps 256 \
      --keep "$C,100,$((2 * C)),200,$R" --modes compact --no-prefix-hit --json \
      >"$out/free-$model.json"
  fi
done
approx=()
for model in "${models[@]}"; do approx+=("$out/approx-$model.json"); done
"$batonctl" report --out "$out" "${approx[@]}" >/dev/null

python3 - "$out" "${models[@]}" <<'EOF'
import json, os, sys
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
free = [m for m in models if os.path.exists(f"{out}/free-{m}.json")]
if free:
    print("free-running (greedy completions against off's; first difference among the differing)")
for model in free:
    report = json.load(open(f"{out}/free-{model}.json"))
    print(f"  {model:18s} off's completions: median {report['off_distinct_tokens_median']:.1f} "
          f"distinct tokens of {report['tokens']}")
    for r in report["results"]:
        first = ("-" if r["diverging"] == 0 else
                 f"{r['first_divergence_median']:.1f} / {r['first_divergence_mean']:.1f}")
        print(f"  {model:18s} K={r['keep']:<4d} identical {r['identical']}/{r['completions']} "
              f"upper95 {r['divergence_upper95']:.4f} positions differ "
              f"{r['position_divergence_share']:.2e} first median/mean {first}")
EOF
