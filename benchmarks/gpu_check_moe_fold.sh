#!/usr/bin/env bash
# The expert grid on NCCL (issue 50): Megatron-Core's folding as the runner trains it, ep 4 over tp 2 x dp 2 on 4
# GPUs, against one GPU, in fp32 (the same sums in another order: losses within 1e-4 over 20 steps, as the gloo test
# tests/train/test_moe.py::test_ep_folded_over_tensor_parallel_ranks_trains_as_one_process holds on CPU), then the
# estimate's per-rank memory beside what each GPU measured (toolkit compare --run). Has not run yet: this project
# has not been lent a machine with 4 GPUs.
#
#   bash benchmarks/gpu_check_moe_fold.sh          # on a 4-GPU machine, from the repository root (about 2 minutes)
#
# Headline lines come last, one per line, as `name: value`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${TMPDIR:-/tmp}}/gpu-check-moe-fold
rm -rf "$OUT"
mkdir -p "$OUT"
GPUS=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | wc -l)
if [ "$GPUS" -lt 4 ]; then
  echo "needs 4 GPUs, found $GPUS: nothing run" >&2
  exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
FLAGS=(--layers 4 --hidden 512 --heads 8 --vocab 256 --seq 256 --experts 8 --top-k 2 --expert-ffn 1024
  --balance-loss 0.01 --micro-batch 4 --global-batch 16 --precision fp32 --steps 20 --warmup 2 --lr 3e-4
  --eval-every 0 --checkpoint-every 0 --num-workers 0 --no-progress)
python -m toolkit.cli train "${FLAGS[@]}" --out "$OUT/one"
python -m toolkit.cli train "${FLAGS[@]}" --tp 2 --ep 4 --nproc 4 --out "$OUT/folded"
python -m toolkit.cli compare --run "$OUT/folded"
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from toolkit.runs.folder import read_metrics

out = Path(sys.argv[1])
one, folded = (read_metrics(out / name / "metrics.jsonl") for name in ("one", "folded"))
worst = max(abs(a["loss"] / b["loss"] - 1) for a, b in zip(folded, one))
print(f"folded_loss_max_rel_diff: {worst:.2e}")
print(f"folded_matches_one_gpu: {worst < 1e-4}")
PY
