#!/usr/bin/env bash
# The runner's GPU check (issues 14 and 19): a ~1B-parameter GPT in bf16 on one GPU, trained in the torch
# backend's layouts one GPU holds (plain, full recompute, ZeRO-3 on one rank, ZeRO-3 with its parameters
# offloaded to the host; a Mixture of Experts, its experts' thin grouped matmuls on the GPU), each run's MFU and measured peaks (torch.cuda's allocated and reserved, and what the
# device shows in use) against the estimate's, and each run's median step against the step-time model's: with the
# catalog's figures, and with those `toolkit calibrate --gpu-only` measured on this GPU from a smaller
# job (its memory beyond the tensors and its kernels' rates).
#
#   bash benchmarks/gpu_check.sh                      # on the GPU machine, from the repository root
#   LAYERS=2 HIDDEN=64 HEADS=4 SEQ=64 MICRO=2 STEPS=3 WARMUP=1 bash benchmarks/gpu_check.sh    # smoke test on a CPU
#   VARIANTS="plain recompute" bash benchmarks/gpu_check.sh                                      # some of them
#
# Needs only torch, accelerate, numpy, pyyaml, psutil and tqdm (no notebook stack); runs from the
# source tree without installing it. Budget: about 5 minutes on an H100/H200 (60 steps a variant, two short probe runs).
# Headline lines come last, one per line, as `name: value`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${TMPDIR:-/tmp}}/gpu-check
rm -rf "$OUT"
mkdir -p "$OUT"
NAME=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -1)
case "$NAME" in
  *H200*) ACC=H200 ;; *H100*) ACC=H100-SXM ;; *A100*80*) ACC=A100-80GB ;; *A100*) ACC=A100-40GB ;; *) ACC="" ;;
esac
echo "device: ${NAME:-cpu} -> catalog ${ACC:-none}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
VARIANTS=${VARIANTS:-plain recompute zero3 zero3-offload moe}

variant_flags() {
  case "$1" in
    plain) echo "" ;;
    recompute) echo "--recompute full" ;;
    zero3) echo "--zero 3" ;;
    zero3-offload) echo "--zero 3 --offload params" ;;
    # a Mixture of Experts of the same active width: 8 experts of 1408, top-2, and one shared
    moe) echo "--experts 8 --top-k 2 --expert-ffn 1408 --shared-experts 1" ;;
    *) echo "unknown variant $1 (plain, recompute, zero3, zero3-offload, moe)" >&2; exit 2 ;;
  esac
}

# 20 layers x hidden 2048 (SwiGLU, ffn 5632): 1.0e9 parameters; 16k tokens a step
for v in $VARIANTS; do
  echo "== $v"
  # shellcheck disable=SC2046  # (the flags split into words on purpose)
  time python -m toolkit.cli train \
    --layers "${LAYERS:-20}" --hidden "${HIDDEN:-2048}" --heads "${HEADS:-16}" --vocab 256 --seq "${SEQ:-2048}" \
    --mlp swiglu --norm rmsnorm --micro-batch "${MICRO:-8}" --global-batch "${MICRO:-8}" --precision amp-bf16 \
    --steps "${STEPS:-60}" --warmup "${WARMUP:-10}" --lr 3e-4 --checkpoint-every 0 --num-workers 2 --no-progress \
    $(variant_flags "$v") --out "$OUT/$v" ${ACC:+--gpus 1x$ACC} || echo "variant $v failed (exit $?)"
done

# This GPU measured by calibrate (what it holds beyond the tensors, its kernels' rates) on a smaller job than the
# variants (8 layers of 1536, micro-batch 4), so the variants' peaks and step times are predicted, not fitted.
echo "== calibrate --gpu-only"
python -c "
import sys
from toolkit.specs import Job
Job.from_dict({'model': {'layers': 8, 'hidden': 1536, 'heads': 12, 'vocab': 256, 'seq_len': int(sys.argv[1]),
                         'mlp': 'swiglu', 'norm': 'rmsnorm'}, 'batch': {'micro_batch': 4, 'global_batch': 4},
               'precision': {'mode': 'amp-bf16'}, 'cluster': {'accelerator': sys.argv[2] or None, 'count': 1},
               'training': {'num_workers': 2}}).to_yaml(sys.argv[3])
" "${SEQ:-2048}" "$ACC" "$OUT/probe-job.yaml"
time python -m toolkit.cli calibrate --gpu-only --config "$OUT/probe-job.yaml" \
  --out "$OUT/profile.yaml" || echo "calibrate failed (exit $?)"

# Serving (issue 42): a 1B GQA GPT in bf16 with a real KV cache, 16 requests of 1024 + 128 tokens, on this GPU,
# against the serving estimate (the catalog's kernel figures): time to first token, per output token, cache, peak.
if [ "${SERVE:-1}" = 1 ]; then
  echo "== generate"
  time python -m toolkit.cli generate --layers "${LAYERS:-20}" --hidden "${HIDDEN:-2048}" --heads "${HEADS:-16}" \
    --kv-heads 4 --vocab 32000 --seq 2048 --mlp swiglu --norm rmsnorm --precision amp-bf16 \
    --concurrency "${CONCURRENCY:-16}" --input-tokens "${INPUT:-1024}" --output-tokens "${OUTPUT:-128}" \
    --out "$OUT/serve" ${ACC:+--gpus 1x$ACC} || echo "generate failed (exit $?)"
  python -m toolkit.cli compare --run "$OUT/serve" || echo "compare failed (exit $?)"
  python -m toolkit.cli compare --run "$OUT/serve" --json | python -c "
import json, sys
for r in json.load(sys.stdin)['rows']:
    if r['error'] is not None:
        print(f\"serve {r['quantity']} error: {r['error']:+.3f}\")" > "$OUT/serve-headlines.txt" || true
fi

python - "$OUT" $VARIANTS <<'PY'
import sys
from pathlib import Path
from toolkit.estimate import count_params, estimate
from toolkit.specs import Job, load_catalog
from toolkit.trace.report import compare_run
from toolkit.train.summary import run_summary
out, variants = Path(sys.argv[1]), sys.argv[2:]
profile = out / "profile.yaml"
calibrated = load_catalog(profile) if profile.exists() else None
headlines = []
for v in variants:
    if not (out / v / "metrics.jsonl").exists():
        print(f"{v}: no run")
        continue
    s = run_summary(out / v)
    job, _ = Job.from_yaml(out / v / "job.yaml").resolve()
    print(f"{v}: {count_params(job.model).total:,} params, {s['tokens_per_s']:,.0f} tokens/s, "
          f"{s['tflops_per_rank']:.1f} TFLOP/s, MFU " + (f"{s['mfu']:.3f}" if s["mfu"] is not None else "n/a"))
    print(f"  measured peak ({s['mem_kind']}) {s['measured_peak_bytes'] / 2**30:.2f} GiB, "
          f"estimate {s['estimated_peak_bytes'] / 2**30:.2f} GiB at {s['estimated_phase']}")
    if s["mfu"] is not None:
        headlines.append(f"{v} mfu: {s['mfu']:.3f}")
    if job.cluster.accelerator:          # the step-time model against the run: datasheet, then calibrated here
        for label, files in (("catalog", []), ("calibrated", [profile] if calibrated is not None else None)):
            if files is None:
                continue
            step = compare_run(out / v, files, trace=False)["time"]["step_s"]
            print(f"  step {step['measured']:.3f} s measured, {step['estimate']:.3f} s modelled ({label}): "
                  f"{step['error']:+.1%}")
            headlines.append(f"{v} step error ({label}): {step['error']:+.3f}")
    headlines.append(f"{v} memory ratio measured/estimate: {s['measured_peak_bytes'] / s['estimated_peak_bytes']:.3f}")
    for kind in ("reserved", "device"):        # what the allocator and the device hold beyond the tensors
        measured, modelled = s.get(f"{kind}_peak_bytes"), s.get(f"estimated_{kind}_peak_bytes")
        if measured and modelled:
            print(f"  {kind} peak measured {measured / 2**30:.2f} GiB, estimate {modelled / 2**30:.2f} GiB")
            headlines.append(f"{v} {kind} ratio measured/estimate: {measured / modelled:.3f}")
            if calibrated is not None and job.cluster.accelerator:     # the same with this device's measured terms
                mine = estimate(job, calibrated)["memory"][f"{kind}_peak_bytes"]
                print(f"  {kind} peak estimated with the calibrated device terms {mine / 2**30:.2f} GiB")
                headlines.append(f"{v} {kind} ratio measured/calibrated estimate: {measured / mine:.3f}")
serve = out / "serve-headlines.txt"
if serve.exists():
    headlines += serve.read_text().split("\n")
print()
print("\n".join(h for h in headlines if h))
PY
