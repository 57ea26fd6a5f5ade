"""Run one measuring function on several real gloo ranks and collect what each rank measured.

The programs that do not run on fake tensors (torch's pipeline schedules, DeepSpeed's ZeRO)
run for real on small models, one process per rank. A rank that fails, or is killed from
outside, becomes a MeasurementFailed that names it and says what to shrink.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..specs.errors import MeasurementFailed
from ..specs.job import Job
from .result import TraceResult

__all__ = ["trace_on_ranks", "quiet_output"]

MeasureRank = Callable[[Job, int, int], TraceResult]
"""(job, rank, world size) -> that rank's measurement; runs inside its own process with the group set up."""


def trace_on_ranks(
    measure: MeasureRank,
    job: Job,
    world: int,
    program: str,
    role: str,
    shrink: str,
    result: Callable = TraceResult,
    quiet: bool = False,
) -> list:
    """Every rank's measurement, rank 0 first. `program` and `role` name the trace and a rank in messages
    ("pipeline", "stage"); `shrink` says what to make smaller when a rank is killed (usually for memory).
    `result` builds a rank's answer from its fields (a TraceResult; `dict` for other measurements). `quiet`: the
    ranks' own output (library warnings, the profiler's stages) goes nowhere; a failure is still reported."""
    with tempfile.TemporaryDirectory() as out:
        # this process hosts the ranks' rendezvous on a port it holds from the start (a port picked, released and
        # bound again by rank 0 could be taken meanwhile by another run on the machine)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        port = store.port
        _start_forkserver()
        context = mp.start_processes(
            _rank_main,
            args=(measure, job.to_dict(), world, port, out, role, quiet),
            nprocs=world,
            start_method="forkserver",
            join=False,
        )
        try:
            while not context.join():
                pass
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as failure:  # a rank failed, or was killed
            raise MeasurementFailed(
                f"{program} trace failed on {_first_failure(context, out, role, shrink)}"
            ) from failure
        return [result(**json.loads(Path(out, f"{role}{rank}.json").read_text())) for rank in range(world)]


def _first_failure(context, out: str, role: str, shrink: str) -> str:
    """The rank that failed first and why. A rank killed by a signal (other than the SIGTERM the context sends
    the survivors) is the cause even when a peer's 'connection reset' traceback was written before it was seen."""
    for rank, process in enumerate(context.processes):
        code = process.exitcode
        if code is not None and code < 0 and -code != signal.SIGTERM and not Path(out, f"{role}{rank}.err").exists():
            return f"{role}{rank}: killed by {signal.Signals(-code).name} (out of memory? {shrink})"
    errors = sorted(Path(out).glob(f"{role}*.err"), key=lambda p: p.stat().st_mtime)
    if errors:
        return f"{errors[0].stem}: {errors[0].read_text().strip().splitlines()[-1]}"
    failed = [(rank, p.exitcode) for rank, p in enumerate(context.processes) if p.exitcode]
    rank, code = failed[0] if failed else (0, "?")
    return f"{role}{rank}: exited with code {code}"


def _start_forkserver() -> None:
    """Ranks fork from a server that imported torch and the tracers once, instead of each importing them
    anew (seconds per rank); the server inherits this process's environment when it starts."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed, preloaded below, picks it on import
    preload = ["torch", "toolkit.trace.pipeline", "toolkit.trace.zero"]
    if importlib.util.find_spec("deepspeed") is not None:
        preload.append("deepspeed")
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)


def _rank_main(
    rank: int, measure: MeasureRank, job_dict: dict, world: int, port: int, out: str, role: str, quiet: bool = False
) -> None:
    with quiet_output() if quiet else contextlib.nullcontext():
        _measure_on_rank(rank, measure, job_dict, world, port, out, role)


def _measure_on_rank(rank: int, measure: MeasureRank, job_dict: dict, world: int, port: int, out: str, role: str):
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        result = measure(Job.from_dict(job_dict), rank, world)
        fields = result if isinstance(result, dict) else dataclasses.asdict(result)
        Path(out, f"{role}{rank}.json").write_text(json.dumps(fields))
        dist.barrier()  # no rank closes its connections while another still sends
    except BaseException:
        Path(out, f"{role}{rank}.err").write_text(traceback.format_exc())  # the first failure, not its echoes
        raise
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def quiet_output():
    """Inside, this process's stdout and stderr go nowhere at the file-descriptor level (C++ libraries' lines too: the
    profiler's stages, gloo's warnings) and warnings are dropped before they are formatted; both come back after."""
    import warnings

    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(null, 1), os.dup2(null, 2)
            yield
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
