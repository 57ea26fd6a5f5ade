"""`--compile` (torchtitan's per-block torch.compile) against the eager program: `python benchmarks/compile_check.py`

A small GPT (2 layers of 128, SwiGLU, RoPE, fp32) trains 10 steps eager and compiled, in one process, on 2 DDP
ranks and on 2 FSDP2 (ZeRO-3) ranks; each compiled run's losses against the eager run's (target: within 1e-5 relative: the same sums, fused in
another order), and their steps' median time. Results: benchmarks/results/compile_check.json. Headline figures last.
About 2 minutes on 2 cores (inductor compiles each block on first use).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import provenance

FLAGS = (
    "--layers 2 --hidden 128 --heads 4 --vocab 256 --seq 64 --mlp swiglu --norm rmsnorm --micro-batch 2 "
    "--global-batch 4 --precision fp32 --steps 10 --warmup 1 --lr 1e-3 --num-workers 0 --no-progress "
    "--checkpoint-every 0"
).split()
RESULTS = Path(__file__).parent / "results" / "compile_check.json"
TOLERANCE = 1e-5


def train(out: Path, ranks: int, *extra: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "train", *FLAGS, *extra, "--nproc", str(ranks), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"train failed: {done.stderr.strip()[-500:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="compile-check-"))
    rows = []
    for ranks, layout in ((1, []), (2, []), (2, ["--zero", "3"])):
        name = f"{ranks}{''.join(layout)}"
        eager = train(work / f"eager{name}", ranks, *layout)
        compiled = train(work / f"compiled{name}", ranks, *layout, "--compile")
        diff = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(eager, compiled))
        step = {
            name: statistics.median(r["time_s"] for r in run[2:])
            for name, run in (("eager", eager), ("compiled", compiled))
        }
        where = " ".join(layout) or "replicas"
        # the first step after the two MemTracker measures compiles the blocks: its time is the compile's evidence
        first_compiled_s = compiled[2]["time_s"]
        rows.append(
            {
                "ranks": ranks,
                "layout": where,
                "max_relative_loss_difference": diff,
                "median_step_s": step,
                "first_compiled_step_s": first_compiled_s,
            }
        )
        print(
            f"{ranks} rank(s), {where}: max relative loss difference {diff:.1e}; median step eager "
            f"{step['eager']:.4f} s, compiled {step['compiled']:.4f} s (step 3, compiling: {first_compiled_s:.1f} s)",
            flush=True,
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**provenance(), "tolerance": TOLERANCE, "rows": rows}, indent=1) + "\n")
    worst = max(r["max_relative_loss_difference"] for r in rows)
    print(f"compile_max_relative_loss_difference: {worst:.1e}")
    print(f"compile_within_tolerance: {worst <= TOLERANCE}")


if __name__ == "__main__":
    main()
