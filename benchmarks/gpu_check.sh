#!/usr/bin/env bash
# The runner's GPU check (issue 4): a ~1B-parameter GPT in bf16 for a few hundred steps on one GPU,
# then MFU and the measured peak memory (torch.cuda.max_memory_allocated) against the estimate.
#
#   bash benchmarks/gpu_check.sh                      # on the GPU machine, from the repository root
#   LAYERS=2 HIDDEN=64 HEADS=4 SEQ=64 MICRO=2 STEPS=3 WARMUP=1 bash benchmarks/gpu_check.sh    # smoke test on a CPU
#
# Needs only torch, accelerate, numpy, pyyaml, psutil and tqdm (no notebook stack); runs from the
# source tree without installing it. Budget: under 4 minutes on an H100/H200.
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
# 20 layers x hidden 2048 (SwiGLU, ffn 5632): 1.0e9 parameters; 16k tokens a step
time python -m toolkit.cli train \
  --layers "${LAYERS:-20}" --hidden "${HIDDEN:-2048}" --heads "${HEADS:-16}" --vocab 256 --seq "${SEQ:-2048}" \
  --mlp swiglu --norm rmsnorm --micro-batch "${MICRO:-8}" --global-batch "${MICRO:-8}" --precision amp-bf16 \
  --steps "${STEPS:-200}" --warmup "${WARMUP:-10}" --lr 3e-4 --checkpoint-every 0 --num-workers 2 --no-progress \
  --out "$OUT/run" ${ACC:+--gpus 1x$ACC}
python - "$OUT/run" <<'PY'
import sys
from toolkit.estimate import count_params
from toolkit.specs import Job
from toolkit.train.summary import run_summary
s = run_summary(sys.argv[1])
job, _ = Job.from_yaml(f"{sys.argv[1]}/job.yaml").resolve()
print(f"params: {count_params(job.model).total:,}")
print(f"tokens_per_s: {s['tokens_per_s']:,.0f}")
print(f"tflops_per_gpu: {s['tflops_per_rank']:.1f}")
print(f"mfu: {s['mfu']:.3f}" if s["mfu"] is not None else "mfu: n/a")
print(f"measured peak ({s['mem_kind']}): {s['measured_peak_bytes'] / 2**30:.2f} GiB")
print(f"estimated peak: {s['estimated_peak_bytes'] / 2**30:.2f} GiB")
print(f"memory ratio measured/estimate: {s['measured_peak_bytes'] / s['estimated_peak_bytes']:.3f}")
for kind in ("reserved", "device"):        # issue 19: what the allocator and the device hold beyond the tensors
    measured, modelled = s.get(f"{kind}_peak_bytes"), s.get(f"estimated_{kind}_peak_bytes")
    if measured and modelled:
        print(f"{kind} peak measured/estimate: {measured / 2**30:.2f} / {modelled / 2**30:.2f} GiB, "
              f"ratio {measured / modelled:.3f}")
PY
