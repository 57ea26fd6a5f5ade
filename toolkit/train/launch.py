"""Start a training run: check the job, then train in this process or in N ranks.

N ranks are N worker processes with the environment torch.distributed expects (RANK, WORLD_SIZE,
MASTER_ADDR, ...), gloo on CPU and NCCL on GPUs, chosen by accelerate. We start them ourselves
rather than through `accelerate launch`, whose `--cpu --num_processes N` silently starts one process,
so that we can (1) refuse a bad job before any process starts, (2) pass a SIGTERM (a spot
interruption notice, a Stop button) to every rank so that they checkpoint together, and (3) say
clearly which rank died and how, stop the others, and name the checkpoint a rerun resumes from.
For several nodes, start `python -m toolkit.train.worker JOB OUT` with torchrun or accelerate.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..specs import Job, SpecError, load_catalog
from .checkpoint import latest_checkpoint, list_checkpoints, resume_key
from .checks import refuse_accelerate_overrides, runner_checks

__all__ = ["prepare_run", "launch"]


def prepare_run(job: Job, out_dir: str | Path, nproc: int) -> Job:
    """Fix the data-parallel degree to nproc / (tp × pp), check everything the runner needs, write OUT/job.yaml."""
    if nproc < 1:
        raise SpecError("--nproc", nproc, "must be 1 or more")
    par = job.parallel
    model_parallel = par.tp * par.pp
    if par.dp is not None and par.dp * model_parallel != nproc:
        raise SpecError("parallel.dp", par.dp, f"the job asks for dp × tp × pp = {par.dp * model_parallel} ranks but "
                                               f"--nproc = {nproc}; make them equal, or leave dp out")
    if nproc % model_parallel:
        raise SpecError("--nproc", nproc, f"must be a multiple of tp × pp = {model_parallel}")
    job = job.replace(parallel=dataclasses.replace(par, dp=nproc // model_parallel),
                      cluster=dataclasses.replace(job.cluster, count=nproc))
    resolved, _notes = job.resolve(load_catalog())
    runner_checks(resolved)
    refuse_accelerate_overrides(resolved)
    from .data import BYTE_VOCAB, TokenShards
    vocab = TokenShards(resolved.training.data, "train", resolved.model.seq_len).vocab \
        if resolved.training.data else BYTE_VOCAB                                  # exists, long enough
    if vocab > resolved.model.vocab:
        raise SpecError("model.vocab", resolved.model.vocab, f"is smaller than the data's vocabulary ({vocab})")
    if resolved.training.init_from and not Path(resolved.training.init_from).is_dir():
        raise SpecError("training.init_from", resolved.training.init_from, "no such folder")
    out = Path(out_dir)
    if (out / "job.yaml").exists() and list_checkpoints(out / "checkpoints"):
        if resume_key(Job.from_yaml(out / "job.yaml")) != resume_key(job):
            raise SpecError("--out", str(out), "holds checkpoints of a different job (a resume may change the "
                                               "schedule, not the model, layout, data or seed); use a new --out "
                                               "folder, or delete its checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    job.to_yaml(out / "job.yaml")
    return job


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(job: Job, out_dir: str | Path, nproc: int = 1, peak_tflops: float | None = None,
           progress: bool = True) -> int:
    """Run the job; returns the exit code (0 done or stopped cleanly, 1 a rank failed, 3 stopped by diagnosis)."""
    job = prepare_run(job, out_dir, nproc)
    out = Path(out_dir)
    allocator = _allocator_env(job)
    if nproc == 1:
        os.environ.update(allocator)             # read by torch's CUDA allocator at its first allocation
        from .loop import TrainingStopped, run_training
        try:
            run_training(job, out, peak_tflops=peak_tflops, progress=progress)
        except TrainingStopped as stop:
            print(f"toolkit train: stopped: {stop}", file=sys.stderr)
            return 3
        return 0
    port = _free_port()
    workers = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc))),
                   **allocator)
        command = [sys.executable, "-m", "toolkit.train.worker", str(out / "job.yaml"), str(out)]
        if peak_tflops is not None:
            command += ["--peak-tflops", str(peak_tflops)]
        if not progress:
            command += ["--no-progress"]
        workers.append(subprocess.Popen(command, env=env))
    return _supervise(workers, out)


def _allocator_env(job: Job) -> dict:
    """memory.expandable_segments as torch's allocator reads it (the estimate's fragmentation assumes it)."""
    if not job.memory.expandable_segments:
        return {}
    current = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in current:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": ",".join(filter(None, [current, "expandable_segments:True"]))}


def _supervise(workers: list[subprocess.Popen], out: Path) -> int:
    """Wait for the ranks; forward SIGTERM/SIGINT to all; if one dies, stop the rest and say so."""
    def forward(signum, _frame):
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            codes = [w.poll() for w in workers]
            failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                for w in workers:
                    if w.poll() is None:
                        w.terminate()
                deadline = time.monotonic() + 10
                for w in workers:
                    try:
                        w.wait(timeout=max(deadline - time.monotonic(), 0.1))
                    except subprocess.TimeoutExpired:
                        w.kill()
                if code in (2, 3):            # the rank already printed a one-line reason
                    return code
                _, path, _ = latest_checkpoint(out / "checkpoints")
                where = f"the newest valid checkpoint is {path.name}" if path else "no checkpoint was saved yet"
                print(f"toolkit train: rank {rank} {_describe(code)}; the other ranks were stopped. {where}; "
                      "run the same command again to resume from it.", file=sys.stderr)
                return 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
