"""A Mixture of Experts trained on gloo ranks with expert parallelism, against one process: `python
benchmarks/moe_layouts.py`

A small MoE GPT (4 layers, hidden 256, 8 heads, byte vocabulary, 128 tokens; every block's MLP 8 SwiGLU experts of
width 512, top-2, one shared expert, the per-sequence balancing loss at 0.01), 20 steps, global batch 16. fp32
rows are compared with one fp32 process (target <= 1e-4: the same sums in another order), the amp-bf16 row with
one amp-bf16 process (3e-2 stated, not a target). Top-k routing is discontinuous: where two experts' scores for a
token tie within rounding, a run that sums in another order may pick the other one, and from that step its losses
depart from the reference (each row's `departs_at`: the first step more than 1e-6 apart); the fp32 target is
held on the steps before it. Each row's per-rank tensor peak (memory/rank*.json) is compared
with the estimate at the load that rank's experts took (toolkit.trace.report.at_rank_routing; target 3 %). Then
the ep-2 run's step-10 checkpoint goes on in one process. Results: benchmarks/results/moe_layouts.json (notebook
08_moe draws it). Headline figures last. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from layouts import difference, first_step_difference, row_record, tokens_per_s
from provenance import provenance

MODEL = (
    "--layers 4 --hidden 256 --heads 8 --vocab 256 --seq 128 --mlp swiglu --experts 8 --top-k 2 --expert-ffn 512 "
    "--shared-experts 1 --balance-loss 0.01 --micro-batch 2 --precision fp32 --global-batch 16 --steps 20 "
    "--warmup 2 --lr 2e-3 --no-progress --num-workers 0 --checkpoint-every 10"
).split()
FP32_TOLERANCE, BF16_TOLERANCE, MEMORY_TOLERANCE, DEPARTED = 1e-4, 3e-2, 0.03, 1e-6
RESULTS = Path(__file__).parent / "results" / "moe_layouts.json"

LAYOUTS = [  # (name, flags, ranks)
    ("ep 2", ["--ep", "2"], 2),
    ("ep 2 x dp 2", ["--ep", "2"], 4),
    ("ep 4", ["--ep", "4"], 4),
    ("ep 2, ZeRO-3 (FSDP2 over the experts' group)", ["--ep", "2", "--zero", "3"], 2),
    ("ep 2 x dp 2, ZeRO-3", ["--ep", "2", "--zero", "3"], 4),
    ("ep 2 x pp 2 (1F1B)", ["--ep", "2", "--pp", "2"], 4),
    ("ep 2 x tp 2 (tp on the attention)", ["--ep", "2", "--tp", "2"], 4),
]
BF16_LAYOUTS = [("ep 2 amp-bf16", ["--ep", "2"], 2)]


def train(out: Path, flags: list[str], ranks: int, data: Path) -> tuple[list[dict], float]:
    began = time.perf_counter()
    command = [sys.executable, "-m", "toolkit.cli", "train", *MODEL, *flags, "--nproc", str(ranks)]
    command += ["--out", str(out), "--data", str(data)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode:
        raise SystemExit(f"{' '.join(flags)} on {ranks}: {result.stderr.strip().splitlines()[-1]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r], time.perf_counter() - began


def departure(run: list[dict], ref: list[dict]) -> int | None:
    """The first step whose loss is more than DEPARTED apart from the reference's (a routing flip), or None."""
    for a, b in zip(run, ref):
        if abs(a["loss"] - b["loss"]) / abs(b["loss"]) > DEPARTED:
            return a["step"]
    return None


def rank_memory(out: Path) -> list[dict]:
    """Each rank's measured tensor peak beside the estimate at the load its experts took."""
    from toolkit.estimate.memory import stage_memory_estimate
    from toolkit.runs.folder import read_rank_memory
    from toolkit.specs import Job, load_catalog
    from toolkit.trace.report import at_rank_routing

    job, _ = Job.from_yaml(out / "job.yaml").resolve(load_catalog())
    rows = []
    for record in read_rank_memory(out):
        estimate = float(stage_memory_estimate(at_rank_routing(job, record), record["stage"]).peak_bytes)
        rows.append(
            {
                "rank": record["rank"],
                "stage": record["stage"],
                "expert_load": record.get("expert_load", 1.0),
                "measured_bytes": record["peak_bytes"],
                "estimate_bytes": estimate,
                "error": (estimate - record["peak_bytes"]) / record["peak_bytes"],
            }
        )
    return rows


def main() -> None:
    from toolkit.train.data import ensure_demo_corpus

    work = Path(tempfile.mkdtemp(prefix="moe-layouts-"))
    data = ensure_demo_corpus(work / "cache")
    ref32, _ = train(work / "one-fp32", [], 1, data)
    ref16, _ = train(work / "one-bf16", ["--precision", "amp-bf16"], 1, data)
    print(
        f"{'layout':46s} {'ranks':>5s} {'precision':>9s} {'max rel loss diff':>18s} {'departs':>8s} {'all steps':>10s} "
        f"{'peak err':>9s} {'wall s':>7s}"
    )
    stored = {"reference": {"fp32": [r["loss"] for r in ref32], "amp-bf16": [r["loss"] for r in ref16]}, "rows": []}
    rows = [(n, f, r, "fp32", ref32) for n, f, r in LAYOUTS]
    rows += [(n, f + ["--precision", "amp-bf16"], r, "amp-bf16", ref16) for n, f, r in BF16_LAYOUTS]
    worst = {"fp32": 0.0, "amp-bf16": 0.0}
    worst_memory = 0.0
    for index, (name, flags, ranks, mode, ref) in enumerate(rows):
        records, wall_s = train(work / f"row{index}", flags, ranks, data)
        departs = departure(records, ref) if mode == "fp32" else None
        held = records if departs is None else records[: departs - 1]
        diff = difference(held, ref[: len(held)]) if held else 0.0
        whole = difference(records, ref)
        memory = rank_memory(work / f"row{index}")
        peak_error = max(abs(r["error"]) for r in memory)
        worst[mode] = max(worst[mode], diff)
        worst_memory = max(worst_memory, peak_error)
        figures = {"max_loss_difference": diff, "departs_at": departs, "max_loss_difference_all_steps": whole}
        figures.update(step1_loss_difference=first_step_difference(records, ref), ranks_memory=memory)
        figures.update(peak_error=peak_error, tokens_per_s=tokens_per_s(records))
        stored["rows"].append(row_record(name, ranks, mode, records, **figures))
        print(
            f"{name:46s} {ranks:5d} {mode:>9s} {diff:18.1e} {str(departs or '-'):>8s} {whole:10.1e} "
            f"{100 * peak_error:8.2f}% {wall_s:7.1f}",
            flush=True,
        )

    moved = work / "moved"  # the ep-2 run's step-10 checkpoint, on one process
    shutil.copytree(work / "row0", moved)
    for late in (moved / "checkpoints").glob("step_00000020*"):
        shutil.rmtree(late) if late.is_dir() else late.unlink()
    resumed, _ = train(moved, [], 1, data)
    resume_diff = difference(resumed, ref32)
    print(f"{'ep 2 -> resumed in one process':46s} {1:5d} {'fp32':>9s} {resume_diff:18.1e}")
    shutil.rmtree(work, ignore_errors=True)
    stored["resume_ep2_to_one_process_difference"] = resume_diff
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**provenance(), **stored}, indent=1) + "\n")
    departed = sum(1 for r in stored["rows"] if r["departs_at"])
    print(f"moe_fp32_max_loss_difference: {worst['fp32']:.1e}")
    print(f"moe_fp32_rows_departing_by_a_routing_flip: {departed}")
    print(f"moe_bf16_max_loss_difference: {worst['amp-bf16']:.1e}")
    print(f"moe_rank_peak_max_error_pct: {100 * worst_memory:.2f}")
    print(f"moe_resume_ep2_to_one_process_difference: {resume_diff:.1e}")
    ok = worst["fp32"] <= FP32_TOLERANCE and worst["amp-bf16"] <= BF16_TOLERANCE and worst_memory <= MEMORY_TOLERANCE
    print(f"moe_layouts_within_targets: {ok}")


if __name__ == "__main__":
    main()
