"""Start a training run: check the job, then train in this process or in N ranks.

N ranks are N worker processes with the environment torch.distributed expects (RANK, WORLD_SIZE,
MASTER_ADDR, ...), gloo on CPU and NCCL on GPUs, chosen by accelerate. We start them ourselves
rather than through `accelerate launch`, whose `--cpu --num_processes N` silently starts one process,
so that we can (1) refuse a bad job before any process starts, (2) pass a SIGTERM (a spot
interruption notice, a Stop button) to every rank so that they checkpoint together, and (3) say
clearly which rank died and how, stop the others, and name the checkpoint a rerun resumes from.
With CUDA GPUs (launcher "auto", the default) N ranks start through `accelerate launch` with a config
written from the job (OUT/accelerate_config.yaml: processes only, `mixed_precision: no`, the program stays
the toolkit's), and the command is printed; SIGTERM still reaches every rank (torch's elastic agent forwards
it) and they checkpoint. `launcher="accelerate"` takes that path on CPU too (gloo ranks, ACCELERATE_USE_CPU).
For several nodes, start `python -m toolkit.train.worker JOB OUT` with torchrun or accelerate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..runs.folder import run_catalog_files, write_run_catalog
from ..specs import Job, SpecError, load_catalog
from ..specs.dims import ParallelDims
from .checkpoint import latest_checkpoint, list_checkpoints, resume_key
from .checks import refuse_accelerate_overrides, runner_checks
from .determinism import pin_environment

__all__ = ["prepare_run", "launch", "free_port", "rank_env"]


def prepare_run(job: Job, out_dir: str | Path, nproc: int, catalog_files=(), force: bool = False) -> Job:
    """Fix the data-parallel degree to nproc / (tp × pp), check everything the runner needs, write OUT/job.yaml
    (and copies of the user's catalog files in OUT/catalogs, so a job on a calibrated or custom device resolves in
    the run; a rerun without --catalog uses the run's copies)."""
    out = Path(out_dir)
    given = list(catalog_files)
    job = ParallelDims.for_world(job, nproc).on_job(job)
    catalog = load_catalog(*(given or run_catalog_files(out)))
    resolved, _notes = job.resolve(catalog)
    runner_checks(resolved)
    if not force:
        from .fits import check_fits

        check_fits(resolved, nproc, catalog)
    refuse_accelerate_overrides(resolved)
    from .data import BYTE_VOCAB, TokenShards, model_tokenizer
    from .documents import load_tokenizer

    if resolved.training.data:  # exists, long enough
        vocab = TokenShards(resolved.training.data, "train", resolved.model.seq_len).vocab
    else:  # the demo corpus, in the starting weights' tokenizer where their folder has one
        tokenizer = model_tokenizer(resolved)
        vocab = load_tokenizer(tokenizer).vocab if tokenizer else BYTE_VOCAB
    if vocab > resolved.model.vocab:
        raise SpecError("model.vocab", resolved.model.vocab, f"is smaller than the data's vocabulary ({vocab})")
    if vocab < resolved.model.vocab / 2:  # (a Llama-3 config on byte data: 128,000 rows that never see a token)
        print(
            f"toolkit train: warning: model.vocab {resolved.model.vocab:,} is far larger than the data's {vocab:,} ids: "
            f"{resolved.model.vocab - vocab:,} rows of the embedding and the head never see a token (prepare the "
            "data with the model's tokenizer: toolkit data prepare FILES --tokenizer MODEL_FOLDER)",
            file=sys.stderr,
        )
    if resolved.training.init_from and not Path(resolved.training.init_from).is_dir():
        raise SpecError("training.init_from", resolved.training.init_from, "no such folder")
    if (out / "job.yaml").exists() and list_checkpoints(out / "checkpoints"):
        if resume_key(Job.from_yaml(out / "job.yaml")) != resume_key(job):
            raise SpecError(
                "--out",
                str(out),
                "holds checkpoints of a different job (a resume may change the "
                "schedule, not the model, layout, data or seed); use a new --out "
                "folder, or delete its checkpoints",
            )
    out.mkdir(parents=True, exist_ok=True)
    if given:
        write_run_catalog(out, given)
    job.to_yaml(out / "job.yaml")
    return job


def rank_env(rank: int, nproc: int, port: int) -> dict:
    """This process's environment for rank `rank` of `nproc` on this host (torchrun's variables, the pinned
    threads of toolkit.train.determinism)."""
    return dict(
        pin_environment(dict(os.environ), nproc),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def free_port() -> int:
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


LAUNCHERS = ("auto", "own", "accelerate")


def launch(
    job: Job,
    out_dir: str | Path,
    nproc: int = 1,
    peak_tflops: float | None = None,
    progress: bool = True,
    launcher: str = "auto",
    catalog_files=(),
    force: bool = False,
) -> int:
    """Run the job; returns the exit code (0 done or stopped cleanly, 1 a rank failed, 3 stopped by diagnosis).
    launcher: "own" starts and supervises the ranks here, "accelerate" through `accelerate launch`, "auto" the
    latter where CUDA GPUs are (the design's multi-GPU path), the former elsewhere."""
    if launcher not in LAUNCHERS:
        raise SpecError("--launcher", launcher, f"must be one of {', '.join(LAUNCHERS)}")
    job = prepare_run(job, out_dir, nproc, catalog_files, force)
    out = Path(out_dir)
    _stop_with_starter()
    allocator = _allocator_env(job)
    if nproc == 1:
        os.environ.update(allocator)  # read by torch's CUDA allocator at its first allocation
        from .loop import TrainingStopped, run_training

        try:
            run_training(job, out, peak_tflops=peak_tflops, progress=progress)
        except TrainingStopped as stop:
            print(f"toolkit train: stopped: {stop}", file=sys.stderr)
            return 3
        return 0
    port = free_port()
    shutil.rmtree(out / "errors", ignore_errors=True)  # (a rank records its exception there: none yet)
    flags = (["--peak-tflops", str(peak_tflops)] if peak_tflops is not None else []) + (
        [] if progress else ["--no-progress"]
    )
    gpus = _cuda_gpus() if launcher != "own" else 0
    if launcher == "accelerate" or (launcher == "auto" and gpus > 0):
        return _accelerate_launch(job, out, nproc, port, flags, allocator, on_cpu=gpus == 0)
    workers = []
    for rank in range(nproc):
        env = dict(
            rank_env(rank, nproc, port),
            TOOLKIT_LAUNCHER_PID=str(os.getpid()),
            **allocator,
        )
        command = [sys.executable, "-m", "toolkit.train.worker", str(out / "job.yaml"), str(out), *flags]
        workers.append(subprocess.Popen(command, env=env))
    return _supervise(workers, out)


STARTER_ENV = "TOOLKIT_STOP_WITH_PID"
"""Set by whoever starts a run it may not outlive (the launcher panel: its notebook's kernel): its process id."""


def _stop_with_starter(poll_s: float = 0.5) -> None:
    """When the process that started this run goes (a notebook closed, its kernel shut down or restarted), stop the
    run as Stop does: SIGTERM to this launcher, which every rank answers by finishing its step and checkpointing.
    The panel starts the run in a session of its own, so the kernel's shutdown signal reaches neither the ranks nor
    their DataLoader workers; this is how they learn of it."""
    starter = os.environ.get(STARTER_ENV)
    if not starter or not starter.isdigit():
        return

    def watch():
        while os.getppid() == int(starter):
            time.sleep(poll_s)
        print(
            "toolkit train: the notebook that started this run has gone; stopping at the end of the current step "
            "with a checkpoint (run the same command, or Resume, to continue)",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="starter-watch").start()


def _cuda_gpus() -> int:
    from ..runs.proxy import local_devices

    here = local_devices()
    return here.count if here.kind == "cuda" else 0


def _accelerate_launch(
    job: Job, out: Path, nproc: int, port: int, flags: list[str], allocator: dict, on_cpu: bool
) -> int:
    """`accelerate launch` with a config written from the job; the command is printed. A SIGTERM to this process
    goes to accelerate, whose elastic agent passes it to every rank (they checkpoint and exit)."""
    from ..export.cluster import accelerate_config

    config = out / "accelerate_config.yaml"
    config.write_text(
        accelerate_config(job.replace(cluster=dataclasses.replace(job.cluster, count=nproc, gpus_per_node=nproc)))
    )
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(port),
        "-m",
        "toolkit.train.worker",
        str(out / "job.yaml"),
        str(out),
        *flags,
    ]
    env = dict(pin_environment(dict(os.environ), nproc), **allocator)
    if on_cpu:
        env["ACCELERATE_USE_CPU"] = "1"  # gloo ranks (accelerate's --cpu would start only one)
    print("starting: accelerate launch " + " ".join(command[3:]), flush=True)
    process = subprocess.Popen(command, env=env)
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        process.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = process.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code != 0 and stopping and _stopped_at_checkpoint(out):
        return 0  # the ranks checkpointed on the forwarded SIGTERM
    if code != 0:
        _, path, _ = latest_checkpoint(out / "checkpoints")
        where = f"the newest valid checkpoint is {path.name}" if path else "no checkpoint was saved yet"
        print(
            f"toolkit train: accelerate launch exited with code {code}; {where}; run the same command again to "
            "resume from it",
            file=sys.stderr,
        )
        return 1
    return 0


def _stopped_at_checkpoint(out: Path) -> bool:
    """Whether the newest checkpoint holds the last logged step (a clean stop, not a crash)."""
    from ..runs.folder import read_metrics

    saved = list_checkpoints(out / "checkpoints")
    records = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    return bool(saved and records) and saved[-1].name == f"step_{records[-1]['step']:08d}.pt"


def _allocator_env(job: Job) -> dict:
    """memory.expandable_segments as torch's allocator reads it (the estimate's fragmentation assumes it)."""
    if not job.memory.expandable_segments:
        return {}
    current = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in current:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": ",".join(filter(None, [current, "expandable_segments:True"]))}


def _supervise(workers: list[subprocess.Popen], out: Path) -> int:
    """Wait for the ranks; forward SIGTERM/SIGINT to all; if one dies, stop the rest and name the first to die."""

    def forward(signum, _frame):
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    exits = ExitOrder(workers)
    try:
        while True:
            exits.wait(0.2)
            failed = [e for e in exits.order if e["code"] != 0]
            if failed:
                first = failed[0]
                if first["code"] in (2, 3):  # a stop every rank agreed on (e.g. a full disk): let them finish
                    _wait_all(workers, 10.0)
                for w in workers:
                    if w.poll() is None:
                        w.terminate()
                deadline = time.monotonic() + 10
                for w in workers:
                    try:
                        w.wait(timeout=max(deadline - time.monotonic(), 0.1))
                    except subprocess.TimeoutExpired:
                        w.kill()
                exits.wait(0.5)
                exits.write(out / "exits.json")
                if first["code"] in (2, 3):  # the rank already printed a one-line reason
                    return first["code"]
                _, path, _ = latest_checkpoint(out / "checkpoints")
                where = f"the newest valid checkpoint is {path.name}" if path else "no checkpoint was saved yet"
                others = [
                    f"rank {e['rank']} {_describe(e['code'])} {e['at_s'] - first['at_s']:.2f} s later"
                    for e in exits.order[1:]
                    if e["code"] != 0
                ]
                print(
                    f"toolkit train: rank {first['rank']} {_describe(first['code'])}{_error_of(out, first['rank'])}"
                    f" first; the other ranks were stopped{' (' + '; '.join(others) + ')' if others else ''}. "
                    f"{where}; run the same command again to resume from it (exit order: {out / 'exits.json'}"
                    f"{'; tracebacks: ' + str(out / 'errors') if (out / 'errors').is_dir() else ''}).",
                    file=sys.stderr,
                )
                return 1
            if len(exits.order) == len(workers):
                exits.write(out / "exits.json")
                return 0
    finally:
        exits.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait_all(workers: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for w in workers:
        try:
            w.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            return


class ExitOrder:
    """The order in which the ranks exit, stamped with a monotonic clock as each exits: a pidfd per process
    (Linux), which becomes readable the moment it dies, else polling every 10 ms. torch's elastic agent stamps
    exits in whole seconds and reports the lowest failed rank, which names the wrong rank when one rank's death
    brings down the others."""

    def __init__(self, workers: list[subprocess.Popen]):
        self.workers, self.start = workers, time.monotonic()
        self.order: list[dict] = []
        self.fds = {}
        for rank, w in enumerate(workers):
            try:
                self.fds[os.pidfd_open(w.pid)] = rank
            except (AttributeError, OSError):  # (no pidfd: polled below)
                pass

    def wait(self, timeout_s: float) -> None:
        """Block until a rank exits (or `timeout_s`), then record, with the time, every rank that has exited."""
        pending = [fd for fd, rank in self.fds.items() if not self._seen(rank)]
        if len(self.fds) == len(self.workers):
            if pending:
                select.select(pending, [], [], timeout_s)
        else:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and not any(
                w.poll() is not None and not self._seen(r) for r, w in enumerate(self.workers)
            ):
                time.sleep(0.01)
        now = time.monotonic() - self.start
        for rank, w in enumerate(self.workers):
            if not self._seen(rank) and w.poll() is not None:
                self.order.append({"rank": rank, "code": w.returncode, "at_s": now})

    def _seen(self, rank: int) -> bool:
        return any(e["rank"] == rank for e in self.order)

    def write(self, path: Path) -> None:
        rows = [{**e, "signal": signal.Signals(-e["code"]).name if e["code"] < 0 else None} for e in self.order]
        path.write_text(json.dumps(rows, indent=1) + "\n")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _error_of(out: Path, rank: int) -> str:
    """The exception a rank recorded before it died (toolkit.train.worker), as ' (raised X: ...)'."""
    path = out / "errors" / f"rank{rank}.txt"
    return f" (raised {path.read_text().strip()})" if path.exists() else ""
