"""`toolkit generate`: run a serving job's requests for real, in one process or tensor-parallel ranks (gloo on CPU,
NCCL on GPUs), and keep what they measured beside the job.

    generate(job, "runs/gen", nproc=2)     # job.yaml, generate.json (time to first token, per output token, ...)

The folder is what `toolkit compare --run` reads (toolkit.serve.compare).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..capability import generate_refusal
from ..launch.ranks import start_ranks, supervise
from ..runs.folder import write_run_catalog
from ..specs import Job, SpecError, load_catalog
from ..specs.errors import MeasurementFailed
from ..specs.yamlio import check_output_folder

__all__ = ["generate"]


def _check(job: Job, nproc: int) -> Job:
    """The job as the ranks run it: resolved, tp = nproc, one replica, a number of requests."""
    if nproc < 1:
        raise SpecError("--nproc", nproc, "must be 1 or more")
    par = job.parallel
    if (par.tp or 1) not in (1, nproc) or (par.pp or 1) > 1 or (par.dp or 1) > 1:
        raise SpecError(
            "--nproc",
            nproc,
            "generate runs one replica over tensor parallelism: --nproc N is tp N (no --pp, no --dp)",
        )
    job = job.replace(parallel=dataclasses.replace(par, tp=nproc, dp=1), workload="inference")
    if job.serving.concurrency == "max":
        raise SpecError("serving.concurrency", "max", "generate runs a given number of requests: give --concurrency N")
    if job.training.init_from and not Path(job.training.init_from).is_dir():
        raise SpecError("training.init_from", job.training.init_from, "no such folder")
    return job


def _check_runnable(job: Job) -> None:
    """What the runner's generation cannot do, in one line: toolkit.capability's generate rules."""
    refusal = generate_refusal(job)
    if refusal is not None:
        raise SpecError(*refusal)


def generate(job: Job, out_dir: str | Path, nproc: int = 1, catalog_files=(), verify: bool = False) -> Path:
    """Run the job's requests; returns the run folder (generate.json inside)."""
    job = _check(job, nproc)
    catalog = load_catalog(*catalog_files)
    resolved, _notes = job.resolve(catalog)
    _check_runnable(resolved)
    out = Path(out_dir)
    check_output_folder("--out", str(out))
    out.mkdir(parents=True, exist_ok=True)
    write_run_catalog(out, catalog_files)
    job.to_yaml(out / "job.yaml")
    (out / "generate.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "toolkit.serve.worker", str(out)] + (["--verify"] if verify else [])
    if nproc == 1:
        from .worker import main

        main(command[3:])
    else:
        _run_ranks(command, nproc, out)
    return out


def _run_ranks(command: list[str], nproc: int, out: Path) -> None:
    """The ranks through the shared launcher (toolkit.launch.ranks), each logging to OUT/rank{N}.log; the first
    to fail stops the others (they would wait on it forever) and is named with its last line."""
    exits = supervise(start_ranks(command, nproc, logs=out))
    if exits.failed:
        first = exits.failed[0]
        raise MeasurementFailed(
            f"generate: {_failure(first['rank'], first['code'], out)} (the run folder {out} keeps job.yaml)"
        )


def _failure(rank: int, code: int, out: Path) -> str:
    err = (out / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace")
    last = [line for line in err.splitlines() if line.strip()]
    return f"rank {rank} exited with code {code}: {last[-1] if last else 'no message'}"
