"""One rank of a run: `python -m toolkit.train.worker OUT/job.yaml OUT` (started by toolkit.train.launch,
or by torchrun / accelerate launch across nodes). A refusal or a diagnosed stop is one line, not a traceback."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ..launch.determinism import PINNED_ENV

for _name, _value in PINNED_ENV.items():  # before torch loads oneMKL and OpenMP (see determinism.py)
    os.environ.setdefault(_name, _value)

from ..specs import Job, SpecError  # noqa: E402
from .loop import TrainingStopped, run_training  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkit.train.worker")
    parser.add_argument("job")
    parser.add_argument("out")
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    _exit_with_parent()
    finished = False
    try:
        run_training(Job.from_yaml(args.job), args.out, peak_tflops=args.peak_tflops, progress=not args.no_progress)
        finished = True
    except SpecError as err:
        print(f"toolkit train: error: {err}", file=sys.stderr)
        return 2
    except TrainingStopped as stop:  # every rank stops with the same line: rank 0 prints it
        if os.environ.get("RANK", "0") == "0":
            print(f"toolkit train: stopped: {stop}", file=sys.stderr)
        return 3
    except Exception as err:
        _record_error(args.out, err)
        if os.environ.get("TOOLKIT_LAUNCHER_PID"):  # the launcher names the first rank to die, in one line
            return 1
        raise
    finally:
        _shut_down_process_group(finished)
    return 0


def _exit_with_parent(poll_s: float = 0.5, grace_s: float = 8.0) -> None:
    """Stop when the process that started this rank dies (a killed launcher must not leave orphans training on):
    SIGTERM to itself, which checkpoints at the next step boundary as a forwarded SIGTERM does, and exit outright
    if that has not happened within `grace_s`."""
    parent = int(os.environ.get("TOOLKIT_LAUNCHER_PID", os.getppid()))

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _record_error(out: str, err: Exception) -> None:
    """One line naming the exception (errors/rank{r}.txt, for the launcher's report of the first rank to die) and its
    whole traceback (errors/rank{r}.traceback): under toolkit's launcher a rank prints neither, so a dead rank's peers
    (whose collectives fail after it) do not bury the launcher's one line under theirs."""
    rank = os.environ.get("RANK", "0")
    try:
        folder = Path(out) / "errors"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.txt").write_text(f"{type(err).__name__}: {err}"[:500] + "\n")
        (folder / f"rank{rank}.traceback").write_text("".join(traceback.format_exception(err)))
    except OSError:
        pass


def _shut_down_process_group(finished: bool) -> None:
    """Leave the process group explicitly: a gloo group torn down by interpreter exit can abort the
    process ("terminate called without an active exception") after a perfectly good run. After a finished
    run the ranks meet first, so that none closes its connections while another still uses them (a rank
    aborted that way at the end of a 2-step run, about once in ten CI runs)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: after the group is destroyed, objects that still hold it (FSDP2's
    # states, DeviceMesh's sub-groups) can be torn down in an order that aborts the process ("terminate called
    # without an active exception", seen about once in five 2-rank FSDP2 amp-bf16 runs) after a good run. Everything
    # the run writes is closed and fsync'd by now; only the standard streams need flushing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
