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
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..checkpoint import latest_checkpoint, list_checkpoints, resume_key
from ..launch.determinism import pin_environment
from ..launch.ranks import AGREED_STOP_CODES, describe_exit, free_port, start_ranks, supervise
from ..runs.folder import run_catalog_files, write_run_catalog
from ..specs import Job, SpecError, load_catalog
from ..specs.dims import ParallelDims
from ..specs.model import ModelSpec
from .checks import refuse_accelerate_overrides, runner_checks

__all__ = ["prepare_run", "launch"]


def prepare_run(
    job: Job, out_dir: str | Path, nproc: int, catalog_files=(), force: bool = False, preflight=None
) -> Job:
    """Fix the data-parallel degree to nproc / (tp × pp), check everything the runner needs, write OUT/job.yaml
    (and copies of the user's catalog files in OUT/catalogs, so a job on a calibrated or custom device resolves in
    the run; a rerun without --catalog uses the run's copies). `preflight(resolved, nproc, catalog)` refuses a
    job this machine cannot hold (the CLI passes toolkit.plan.preflight.check_fits; `force` skips it)."""
    out = Path(out_dir)
    given = list(catalog_files)
    job = ParallelDims.for_world(job, nproc).on_job(job)
    catalog = load_catalog(*(given or run_catalog_files(out)))
    resolved, _notes = job.resolve(catalog)
    vocab = _data_vocab(resolved)
    if _vocab_left_open(job) and vocab != job.model.vocab:  # (before the checks: the estimate sizes the model)
        print(f"toolkit train: model.vocab {vocab:,}: the data's vocabulary (--vocab N sets another)")
        job = job.replace(model=job.model.replace(vocab=vocab))
        resolved, _notes = job.resolve(catalog)
    runner_checks(resolved)
    if preflight is not None and not force:
        preflight(resolved, nproc, catalog)
    refuse_accelerate_overrides(resolved)
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


def _data_vocab(job: Job) -> int:
    """The vocabulary of the tokens the run reads: its prepared data's, or the demo corpus's (in the starting
    weights' tokenizer where their folder has one, else bytes)."""
    from .data import BYTE_VOCAB, TokenShards, model_tokenizer
    from .documents import load_tokenizer

    if job.training.data:  # exists, long enough
        return TokenShards(job.training.data, "train", job.model.seq_len).vocab
    tokenizer = model_tokenizer(job)
    return load_tokenizer(tokenizer).vocab if tokenizer else BYTE_VOCAB


def _vocab_left_open(job: Job) -> bool:
    """A model given by its shape alone (no preset or Hugging Face config named it) whose vocabulary is still
    ModelSpec's default: --vocab was not given, so the data's tokenizer sets it."""
    default = ModelSpec.__dataclass_fields__["vocab"].default
    return job.model.name is None and job.model.vocab == default


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
    preflight=None,
) -> int:
    """Run the job; returns the exit code (0 done or stopped cleanly, 1 a rank failed, 3 stopped by diagnosis).
    launcher: "own" starts and supervises the ranks here, "accelerate" through `accelerate launch`, "auto" the
    latter where CUDA GPUs are (the design's multi-GPU path), the former elsewhere."""
    if launcher not in LAUNCHERS:
        raise SpecError("--launcher", launcher, f"must be one of {', '.join(LAUNCHERS)}")
    job = prepare_run(job, out_dir, nproc, catalog_files, force, preflight)
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
    shutil.rmtree(out / "errors", ignore_errors=True)  # (a rank records its exception there: none yet)
    flags = (["--peak-tflops", str(peak_tflops)] if peak_tflops is not None else []) + (
        [] if progress else ["--no-progress"]
    )
    gpus = _cuda_gpus() if launcher != "own" else 0
    if launcher == "accelerate" or (launcher == "auto" and gpus > 0):
        return _accelerate_launch(job, out, nproc, free_port(), flags, allocator, on_cpu=gpus == 0)
    command = [sys.executable, "-m", "toolkit.train.worker", str(out / "job.yaml"), str(out), *flags]
    workers = start_ranks(command, nproc, dict(TOOLKIT_LAUNCHER_PID=str(os.getpid()), **allocator))
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
    """Wait for the ranks (toolkit.launch.ranks.supervise); when one dies, name it first and the checkpoint a rerun
    resumes from."""
    exits = supervise(workers)
    exits.write(out / "exits.json")
    if not exits.failed:
        return 0
    first = exits.failed[0]
    if first["code"] in AGREED_STOP_CODES:  # the rank already printed a one-line reason
        return first["code"]
    _, path, _ = latest_checkpoint(out / "checkpoints")
    where = f"the newest valid checkpoint is {path.name}" if path else "no checkpoint was saved yet"
    others = [
        f"rank {e['rank']} {describe_exit(e['code'])} {e['at_s'] - first['at_s']:.2f} s later" for e in exits.failed[1:]
    ]
    print(
        f"toolkit train: rank {first['rank']} {describe_exit(first['code'])}{_error_of(out, first['rank'])}"
        f" first; the other ranks were stopped{' (' + '; '.join(others) + ')' if others else ''}. "
        f"{where}; run the same command again to resume from it (exit order: {out / 'exits.json'}"
        f"{'; tracebacks: ' + str(out / 'errors') if (out / 'errors').is_dir() else ''}).",
        file=sys.stderr,
    )
    return 1


def _error_of(out: Path, rank: int) -> str:
    """The exception a rank recorded before it died (toolkit.train.worker), as ' (raised X: ...)'."""
    path = out / "errors" / f"rank{rank}.txt"
    return f" (raised {path.read_text().strip()})" if path.exists() else ""
