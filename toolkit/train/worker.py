"""One rank of a run: `python -m toolkit.train.worker OUT/job.yaml OUT` (started by toolkit.train.launch,
or by torchrun / accelerate launch across nodes). A refusal or a diagnosed stop is one line, not a traceback."""
from __future__ import annotations

import argparse
import sys

from ..specs import Job, SpecError
from .loop import TrainingStopped, run_training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkit.train.worker")
    parser.add_argument("job")
    parser.add_argument("out")
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    finished = False
    try:
        run_training(Job.from_yaml(args.job), args.out, peak_tflops=args.peak_tflops, progress=not args.no_progress)
        finished = True
    except SpecError as err:
        print(f"toolkit train: error: {err}", file=sys.stderr)
        return 2
    except TrainingStopped as stop:
        print(f"toolkit train: stopped: {stop}", file=sys.stderr)
        return 3
    finally:
        _shut_down_process_group(finished)
    return 0


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
    sys.exit(main())
