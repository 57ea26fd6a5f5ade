"""Loop overhead: tokens/s of the toolkit's runner against a minimal hand-written PyTorch loop.

    .venv/bin/python benchmarks/loop_overhead.py [--repeats 7] [--steps 60]

The same small model (the runner's GPT, 2 layers, hidden 128, seq 64: ~30 ms a step, so that per-step
overhead shows), the same data pipeline (token shards, sampler, DataLoader with one worker) and the same
settings (fp32, AdamW, clipping at 1.0, 2 micro-batches per step), one CPU process. Runs alternate
(toolkit, hand, toolkit, hand, ...) so that drift in the machine hits both; each run's throughput is
taken over its steady steps (after 5 warm-up steps) from wall-clock stamps, which include whatever the
loop does between steps (metrics line, memory reading, progress). Ratio of the medians printed last.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.program.model import GPT  # noqa: E402
from toolkit.runs.folder import read_metrics  # noqa: E402
from toolkit.specs import Job  # noqa: E402
from toolkit.train.data import StepSampler, TokenShards, ensure_demo_corpus, make_loader  # noqa: E402
from toolkit.train.launch import prepare_run  # noqa: E402
from toolkit.train.loop import lr_at, run_training  # noqa: E402

WARMUP = 5


def job_for(steps: int, data: Path) -> Job:
    return Job.from_dict(
        {
            "model": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
            "batch": {"micro_batch": 8, "global_batch": 16},
            "precision": {"mode": "fp32"},
            "training": {
                "steps": steps,
                "warmup_steps": 2,
                "lr": 1e-3,
                "checkpoint_every": 0,
                "num_workers": 1,
                "data": str(data),
            },
        }
    )


def toolkit_run(job: Job, folder: Path) -> float:
    prepare_run(job, folder, 1)
    run_training(job, folder, progress=False)
    records = read_metrics(folder / "metrics.jsonl")
    span = records[-1]["wall_s"] - records[WARMUP - 1]["wall_s"]
    return (len(records) - WARMUP) * job.batch.global_batch * job.model.seq_len / span


def hand_run(job: Job) -> float:
    """What a careful user writes by hand: no metrics, no checkpoints, no accelerate."""
    t, spec = job.training, job.model
    data = TokenShards(t.data, "train", spec.seq_len)
    torch.manual_seed(t.seed)
    model = GPT(spec)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=t.lr,
        betas=(0.9, 0.95),
    )
    accum = job.batch.global_batch // job.batch.micro_batch
    batches = iter(
        make_loader(
            data,
            StepSampler(len(data), job.batch.global_batch, job.batch.micro_batch, 0, 1, t.seed, 0, t.steps),
            t.num_workers,
            t.prefetch,
        )
    )
    stamps = []
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        for _ in range(accum):
            x, y = next(batches)
            (model(x, y) / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stamps.append(time.perf_counter())
    return (len(stamps) - WARMUP) * job.batch.global_batch * spec.seq_len / (stamps[-1] - stamps[WARMUP - 1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = job_for(args.steps, ensure_demo_corpus(tmp))
        ours, hand = [], []
        for r in range(args.repeats):
            ours.append(toolkit_run(job, Path(tmp) / f"run{r}"))
            hand.append(hand_run(job))
            print(f"repeat {r}: toolkit {ours[-1]:,.0f} tokens/s, hand loop {hand[-1]:,.0f} tokens/s")
    print(f"toolkit tokens/s (median): {statistics.median(ours):,.0f}")
    print(f"hand loop tokens/s (median): {statistics.median(hand):,.0f}")
    print(f"ratio: {statistics.median(ours) / statistics.median(hand):.3f}")


if __name__ == "__main__":
    main()
