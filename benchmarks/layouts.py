"""Every layout family the runner trains, on 2, 4 and 8 gloo ranks, against one process: `python benchmarks/layouts.py`

The README's small GPT (4 layers, hidden 256, 8 heads, byte vocabulary, 128 tokens, tied embeddings, learned
positions), 10 steps, global batch 16 (accumulation differs with dp; pipelines run it as micro-batches). fp32 rows are compared with one fp32 process: the same sums in another order,
so the losses agree to ~1e-7 (target <= 1e-4). amp-bf16 rows are compared with one amp-bf16 process: bf16
matmuls over other shards round differently (tolerance 1e-2 stated, not a target); the DeepSpeed backend's
mixed-bf16 rows against one torch process with fp32 master weights (the same tolerance; its fp32 rows, with
--backend deepspeed, against the fp32 process like the others). Then a dp-4 ZeRO-3
checkpoint resumes on 2 ranks. Each row's per-rank tensor peak, measured by the run over its first two steps
(memory/rank*.json), is compared with the estimate (a pipeline rank with its stage's). Headline figures last.
About 14 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance

MODEL = [
    "--layers",
    "4",
    "--hidden",
    "256",
    "--heads",
    "8",
    "--vocab",
    "256",
    "--seq",
    "128",
    "--micro-batch",
    "2",
    "--precision",
    "fp32",  # (a CPU job without it resolves to amp-bf16; the bf16 rows add theirs after)
    "--global-batch",
    "16",
    "--steps",
    "10",
    "--warmup",
    "2",
    "--lr",
    "2e-3",
    "--no-progress",
    "--num-workers",
    "0",
    "--checkpoint-every",
    "5",
]
FP32_TOLERANCE, BF16_TOLERANCE = 1e-4, 1e-2
RESULTS = Path(__file__).parent / "results" / "layouts.json"
"""Every row's losses beside its reference, for notebooks/06_parallelism (committed: the notebook draws it)."""

LAYOUTS = [  # (name, flags, ranks)
    ("dp 2 (DDP)", [], 2),
    ("ZeRO-1 (ZeroRedundancyOptimizer)", ["--zero", "1"], 2),
    ("ZeRO-2 (FSDP2)", ["--zero", "2"], 2),
    ("ZeRO-3 (FSDP2)", ["--zero", "3"], 2),
    ("ZeRO-3 + offload params", ["--zero", "3", "--offload", "params"], 2),
    ("tp 2", ["--tp", "2"], 2),
    ("tp 2 + sp", ["--tp", "2", "--sp"], 2),
    ("dp 4 (DDP)", [], 4),
    ("ZeRO-3 on 4", ["--zero", "3"], 4),
    ("dp 2 x tp 2", ["--tp", "2"], 4),
    ("dp 2 x tp 2 + sp, ZeRO-2", ["--zero", "2", "--tp", "2", "--sp"], 4),
    ("pp 2 (1F1B)", ["--pp", "2"], 2),
    ("pp 2 (GPipe)", ["--pp", "2", "--schedule", "gpipe"], 2),
    ("pp 2 x vpp 2 (interleaved 1F1B)", ["--pp", "2", "--vpp", "2"], 2),
    ("pp 4 (1F1B)", ["--pp", "4"], 4),
    ("pp 3 (1F1B), uneven: 1, 2, 1 layers", ["--pp", "3"], 3),
    ("dp 2 x pp 2 (1F1B)", ["--pp", "2"], 4),
    ("tp 2 x pp 2 (1F1B)", ["--tp", "2", "--pp", "2"], 4),
    ("tp 2 x pp 2 + sp (GPipe)", ["--tp", "2", "--pp", "2", "--sp", "--schedule", "gpipe"], 4),
    ("tp 2 x pp 2 x vpp 2 + sp (interleaved)", ["--tp", "2", "--pp", "2", "--vpp", "2", "--sp"], 4),
    ("dp 2 x tp 2 x pp 2 + sp (1F1B)", ["--tp", "2", "--pp", "2", "--sp"], 8),
    ("dp 2 x pp 2, ZeRO-1 (ZeroRedundancyOptimizer per stage)", ["--pp", "2", "--zero", "1"], 4),
    ("dp 2 x pp 2, ZeRO-2 (FSDP2 stages)", ["--pp", "2", "--zero", "2"], 4),
    ("dp 2 x pp 2 x vpp 2, ZeRO-3 (FSDP2 stages)", ["--pp", "2", "--vpp", "2", "--zero", "3"], 4),
    ("dp 2 x tp 2 x pp 2 + sp, ZeRO-2 (torchtitan's 3-D)", ["--tp", "2", "--pp", "2", "--sp", "--zero", "2"], 8),
    ("DeepSpeed ZeRO-1 fp32", ["--backend", "deepspeed", "--zero", "1"], 2),
    ("DeepSpeed ZeRO-2 fp32", ["--backend", "deepspeed", "--zero", "2"], 2),
    ("DeepSpeed ZeRO-3 fp32", ["--backend", "deepspeed", "--zero", "3"], 2),
    (
        "DeepSpeed ZeRO-2 fp32 + offload optimizer",
        ["--backend", "deepspeed", "--zero", "2", "--offload", "optimizer"],
        2,
    ),
]
BF16_LAYOUTS = [
    ("ZeRO-2 (FSDP2) amp-bf16", ["--zero", "2"], 2),
    ("tp 2 + sp amp-bf16", ["--tp", "2", "--sp"], 2),
    ("tp 2 x pp 2 + sp amp-bf16", ["--tp", "2", "--pp", "2", "--sp"], 4),
    ("pp 2 (1F1B) amp-bf16", ["--pp", "2"], 2),
    ("dp 2 x pp 2, ZeRO-2 amp-bf16", ["--pp", "2", "--zero", "2"], 4),
]
MIXED_LAYOUTS = [  # the DeepSpeed backend (mixed-bf16 with ZeRO), against one torch process with fp32 masters
    ("DeepSpeed ZeRO-1 mixed-bf16", ["--zero", "1"], 2),
    ("DeepSpeed ZeRO-2 mixed-bf16", ["--zero", "2"], 2),
    ("DeepSpeed ZeRO-3 mixed-bf16", ["--zero", "3"], 2),
    ("DeepSpeed ZeRO-2 + offload optimizer", ["--zero", "2", "--offload", "optimizer"], 2),
    ("DeepSpeed ZeRO-2 mixed-bf16 on 4", ["--zero", "2"], 4),
]


def train(out: Path, flags: list[str], ranks: int, data: Path) -> tuple[list[dict], float]:
    began = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "train",
        *MODEL,
        *flags,
        "--nproc",
        str(ranks),
        "--out",
        str(out),
        "--data",
        str(data),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise SystemExit(f"{' '.join(flags)} on {ranks}: {result.stderr.strip().splitlines()[-1]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, time.perf_counter() - began


def difference(run: list[dict], ref: list[dict]) -> float:
    assert [r["step"] for r in run] == [r["step"] for r in ref]
    return max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(run, ref))


def first_step_difference(run: list[dict], ref: list[dict]) -> float:
    """Step 1's loss comes before any update: the program alone, without Adam's amplification of rounding."""
    return abs(run[0]["loss"] - ref[0]["loss"]) / abs(ref[0]["loss"])


def memory_error(out: Path) -> float:
    """Largest |estimate − measured| / measured of the per-rank tensor peaks the run recorded (memory/rank*.json),
    each rank against its own pipeline stage's estimate."""
    from toolkit.estimate.memory import stage_memory_estimate
    from toolkit.runs.folder import read_rank_memory
    from toolkit.specs import Job, load_catalog

    job, _ = Job.from_yaml(out / "job.yaml").resolve(load_catalog())
    return max(
        abs(float(stage_memory_estimate(job, r["stage"]).peak_bytes) - r["peak_bytes"]) / r["peak_bytes"]
        for r in read_rank_memory(out)
    )


def row_record(name: str, ranks: int, mode: str, records: list[dict], **figures) -> dict:
    """One layout's row in a results file: its losses step by step and its figures."""
    return {"layout": name, "ranks": ranks, "precision": mode, "losses": [r["loss"] for r in records], **figures}


def uses_ddp(flags: list[str]) -> bool:
    """Replicas and ZeRO-1 wrap the model in DDP (dp x tp and pipeline rows average gradients without it)."""
    zero = int(flags[flags.index("--zero") + 1]) if "--zero" in flags else 0
    return zero < 2 and "--tp" not in flags and "--pp" not in flags and "deepspeed" not in flags


def tokens_per_s(records: list[dict]) -> float:
    steady = sorted(r["tokens_per_s"] for r in records[1:])
    return steady[len(steady) // 2]


def main() -> None:
    from toolkit.train.data import ensure_demo_corpus

    work = Path(tempfile.mkdtemp(prefix="layouts-"))
    data = ensure_demo_corpus(work / "cache")
    ref32, _ = train(work / "one-fp32", [], 1, data)
    ref16, _ = train(work / "one-bf16", ["--precision", "amp-bf16"], 1, data)  # (argparse: the last --precision wins)
    ref_mixed, _ = train(work / "one-mixed", ["--precision", "mixed-bf16"], 1, data)
    print(
        f"{'layout':36s} {'ranks':>5s} {'precision':>9s} {'max rel loss diff':>18s} {'step 1':>8s} {'peak err':>9s} "
        f"{'tokens/s':>9s} {'wall s':>7s}"
    )
    print(f"{'one process':36s} {1:5d} {'fp32':>9s} {'(reference)':>18s} {tokens_per_s(ref32):9.0f}")
    worst32 = worst16 = worst_mixed = first32 = 0.0
    memory = {"DDP": 0.0, "other": 0.0}
    stored = {
        "reference": {
            "fp32": [r["loss"] for r in ref32],
            "amp-bf16": [r["loss"] for r in ref16],
            "mixed-bf16": [r["loss"] for r in ref_mixed],
        },
        "rows": [],
    }
    rows = [(n, f, r, "fp32", ref32) for n, f, r in LAYOUTS]
    rows += [(n, f + ["--precision", "amp-bf16"], r, "amp-bf16", ref16) for n, f, r in BF16_LAYOUTS]
    rows += [(n, f + ["--precision", "mixed-bf16"], r, "mixed-bf16", ref_mixed) for n, f, r in MIXED_LAYOUTS]
    for index, (name, flags, ranks, mode, ref) in enumerate(rows):
        records, wall_s = train(work / f"row{index}", flags, ranks, data)
        diff = difference(records, ref)
        first = first_step_difference(records, ref)
        mem = memory_error(work / f"row{index}")
        key = "DDP" if uses_ddp(flags) and mode != "mixed-bf16" else "other"
        stored["rows"].append(
            row_record(
                name,
                ranks,
                mode,
                records,
                max_loss_difference=diff,
                step1_loss_difference=first,
                peak_error=mem,
                tokens_per_s=tokens_per_s(records),
            )
        )
        memory[key] = max(memory[key], mem)
        if mode == "fp32":
            worst32, first32 = max(worst32, diff), max(first32, first)
        elif mode == "amp-bf16":
            worst16 = max(worst16, diff)
        else:
            worst_mixed = max(worst_mixed, diff)
        print(
            f"{name:36s} {ranks:5d} {mode:>9s} {diff:18.1e} {first:8.1e} {100 * mem:8.2f}% "
            f"{tokens_per_s(records):9.0f} {wall_s:7.1f}",
            flush=True,
        )

    # spot instances lost: the dp-4 ZeRO-3 run's step-5 checkpoint resumes on 2 ranks
    source, moved = work / f"row{[n for n, *_ in LAYOUTS].index('ZeRO-3 on 4')}", work / "moved"
    shutil.copytree(source, moved)
    for late in (moved / "checkpoints").glob("step_00000010*"):  # (its record, checksum and shards)
        shutil.rmtree(late) if late.is_dir() else late.unlink()
    resumed, _ = train(moved, ["--zero", "3"], 2, data)
    uninterrupted = [
        {"step": i + 1, "loss": loss}
        for i, loss in enumerate(next(r["losses"] for r in stored["rows"] if r["layout"] == "ZeRO-3 on 4"))
    ]
    resume_diff = difference(resumed, uninterrupted)  # against the same run, not interrupted
    print(
        f"{'ZeRO-3 dp 4 -> resumed on dp 2':36s} {2:5d} {'fp32':>9s} {resume_diff:18.1e}  (against dp 4 uninterrupted)"
    )
    shutil.rmtree(work, ignore_errors=True)
    stored["resume_dp4_to_dp2_difference"] = resume_diff
    stored.update(provenance())
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(stored, indent=1))
    print(f"layouts: {len(rows)}")
    print(f"fp32 max relative loss difference: {worst32:.1e}")
    print(f"fp32 within {FP32_TOLERANCE:g}: {str(worst32 <= FP32_TOLERANCE).lower()}")
    print(f"fp32 max relative step-1 loss difference: {first32:.1e}")
    print(f"amp-bf16 max relative loss difference: {worst16:.1e}")
    print(f"DeepSpeed mixed-bf16 max relative loss difference (vs one torch process): {worst_mixed:.1e}")
    print(f"resume dp4 -> dp2 max relative loss difference (vs uninterrupted): {resume_diff:.1e}")
    print(f"per-rank peak max error, FSDP2, tp, pipeline and DeepSpeed rows: {100 * memory['other']:.2f} %")
    print(f"per-rank peak max error, DDP and ZeRO-1 rows: {100 * memory['DDP']:.2f} %")


if __name__ == "__main__":
    main()
