#!/usr/bin/env bash
# CPU model figures in one run: baton's prefill and decode on the small preset, PyTorch eager
# on the same weights and prompts (bench/torch_ced.py, Debian's python3-torch), and this
# machine's sgemm and memcpy limits. Prints a table with baton/torch ratios.
#
#   bench/run_model_bench.sh [MODEL_DIR]     (default: a small preset model in a temp dir)
#
# ISAS=baseline,avx2,avx512 runs baton's decode steps at each of those instruction-set levels
# (default: the best this CPU has, or BATON_CPU_ISA).
# BEFORE_BUILD_DIR=<another build> also runs that build's baton_model_bench on the same model,
# alternating with this one (REPEATS times each, the machine's noise shared), and prints the
# after/before ratios of every figure: the before/after comparison in one run.
# Needs a build (scripts/setup.sh) and `apt-get install python3-torch python3-numpy`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model="${1:-$work/small}"
if [[ ! -f "$model/config.json" ]]; then
  "$build/tools/batonctl" make-model --preset small --seed 0 --out "$model" >/dev/null
fi
repeats="${REPEATS:-3}"
isas=(${ISAS:+--isas "$ISAS"})
check_tokens="$(seq -s, 11 37 4000 | cut -d, -f1-60)"
"$build/tools/batonctl" forward --model "$model" --tokens "$check_tokens" --json >"$work/check.json"
"$build/bench/baton_model_bench" --model "$model" --repeats "$repeats" "${isas[@]}" --json \
  >"$work/baton.json"
if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then
  for round in 1 2; do
    "$BEFORE_BUILD_DIR/bench/baton_model_bench" --model "$model" --repeats "$repeats" --json \
      >"$work/before.$round.json"
    "$build/bench/baton_model_bench" --model "$model" --repeats "$repeats" --json \
      >"$work/after.$round.json"
  done
fi
# Debian's torch reaches BLAS through libblas.so.3, which defaults to OpenBLAS's pthread build;
# like baton, give it the OpenMP build so that its OpenMP threads and BLAS do not contend.
LD_LIBRARY_PATH="/usr/lib/$(gcc -print-multiarch)/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
/usr/bin/python3 "$root/bench/torch_ced.py" --model "$model" --repeats "$repeats" \
  --check "$work/check.json" --check-tokens "$check_tokens" >"$work/torch.json"
/usr/bin/python3 - "$work/baton.json" "$work/torch.json" <<'PY'
import json, sys
baton, torch = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
m = baton["machine"]
print(f"machine: OpenBLAS sgemm {m['sgemm_gflops']:.1f} GFLOP/s on {m['threads']} threads, memcpy "
      f"{m['memcpy_gbps']:.2f} GB/s, read {m['read_gbps']:.2f} GB/s, prefill at {m['isa']}")
print(f"torch {torch['torch']} ({torch['threads']} threads) vs baton, last-row logits max |diff| "
      f"{torch['check_max_abs_diff_last_row']:.2e} (max |logit| {torch['check_max_abs_logit']:.2f})")
print("prefill   L   mode     baton tok/s  model GFLOP/s  /sgemm  torch tok/s  baton/torch")
t = {(p["length"], p["mode"]): p for p in torch["prefill"]}
b = {(p["length"], p["mode"]): p for p in baton["prefill"]}
for p in baton["prefill"]:
    q = t[(p["length"], p["mode"])]
    print(f"       {p['length']:5d}  {p['mode']:7s} {p['tokens_per_s']:11.1f}  {p['model_gflops_per_s']:13.1f}  "
          f"{p['model_gflops_per_s'] / m['sgemm_gflops']:6.2f}  {q['tokens_per_s']:11.1f}  {p['tokens_per_s'] / q['tokens_per_s']:11.2f}")
for length in sorted({p["length"] for p in baton["prefill"]}):
    off, compact = b[(length, "off")], b[(length, "compact")]
    print(f"L={length}: compact/off time {compact['seconds'] / off['seconds']:.3f}, "
          f"estimator FLOP ratio {compact['model_flops'] / off['model_flops']:.3f}")
print("decode: bound = max(bytes read / read rate, FLOPs / sgemm rate)")
print("decode isa       batch  baton ms/step  bound ms  step/bound  torch ms/step  torch/baton")
td = {d["batch"]: d for d in torch["decode"]}
for d in baton["decode"]:
    q = td[d["batch"]]
    print(f"       {d['isa']:8s}  {d['batch']:5d}  {d['step_ms']:13.2f}  {d['bound_ms']:8.2f}  {d['step_over_bound']:10.2f}  "
          f"{q['step_ms']:13.2f}  {q['step_ms'] / d['step_ms']:11.2f}")
print("decode, BF16 weight matrices (same run): isa  batch  ms/step  bf16/fp32 step  step/bound")
for d in baton["decode_bf16"]:
    print(f"       {d['isa']:8s}  {d['batch']:5d}  {d['step_ms']:7.2f}  {d['step_over_fp32']:14.2f}  {d['step_over_bound']:10.2f}")
PY
if [[ -n "${BEFORE_BUILD_DIR:-}" ]]; then
  /usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
runs = [(json.load(open(f"{work}/before.{r}.json")), json.load(open(f"{work}/after.{r}.json")))
        for r in (1, 2)]
print("before/after in one run (two alternating rounds; ratio = after/before, < 1 is faster)")
for r, (b, a) in enumerate(runs, 1):
    for pb, pa in zip(b["prefill"], a["prefill"]):
        print(f"round {r} prefill L={pb['length']:5d} {pb['mode']:7s} tok/s {pb['tokens_per_s']:8.1f} -> "
              f"{pa['tokens_per_s']:8.1f}  time ratio {pa['seconds'] / pb['seconds']:.2f}")
    for db, da in zip(b["decode"], a["decode"]):
        print(f"round {r} decode batch={db['batch']:3d} step {db['step_ms']:7.2f} -> {da['step_ms']:7.2f} ms  "
              f"ratio {da['step_ms'] / db['step_ms']:.2f}  step/bound {db['step_over_bound']:.2f} -> "
              f"{da['step_over_bound']:.2f}")
PY
fi
