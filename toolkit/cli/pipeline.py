"""`toolkit pipeline`: simulate a pipeline schedule, or replay a pipelined run's measured step beside its
simulation (toolkit.estimate.pipeline). Its flags and its command, kept apart from cli.py's job commands."""

from __future__ import annotations

import argparse
import json

from ..specs import SpecError
from ..specs.errors import did_you_mean

__all__ = ["add_pipeline_parser", "cmd_pipeline"]


def add_pipeline_parser(sub) -> argparse.ArgumentParser:
    pipe = sub.add_parser(
        "pipeline",
        help="simulate a pipeline schedule: per-rank timeline, bubble, step time",
        description="Run a schedule's per-rank orders (torch's) against each other: times are "
        "per micro-batch for a whole stage, or one per virtual stage, comma-separated.",
    )
    pipe.add_argument("--stages", metavar="P", type=int, help="pipeline ranks (required without --run)")
    pipe.add_argument("--microbatches", metavar="M", type=int, help="micro-batches per step (required without --run)")
    pipe.add_argument(
        "--run",
        metavar="DIR",
        help="a pipelined `toolkit train` folder: its measured step beside "
        "the schedule simulated from its own chunk times",
    )
    pipe.add_argument("--schedule", metavar="{gpipe,1f1b,interleaved,zb-h1}", default="1f1b")
    pipe.add_argument("--vpp", metavar="V", type=int, default=1, help="virtual stages per rank (interleaved)")
    pipe.add_argument("--forward-s", metavar="S[,S...]", default="1", help="forward time of a stage (default 1)")
    pipe.add_argument("--backward-s", metavar="S[,S...]", default="2", help="whole backward time (default 2)")
    pipe.add_argument(
        "--weight-s",
        metavar="S[,S...]",
        help="the backward's weight-gradient part, which zb-h1 runs apart (default: half the backward)",
    )
    pipe.add_argument("--p2p-s", metavar="S", type=float, default=0.0, help="latency of a send between ranks")
    pipe.add_argument("--json", action="store_true")
    pipe.add_argument("--html", metavar="PATH", help="also write the figures as an HTML page")
    return pipe


def cmd_pipeline(args) -> int:
    from ..estimate.pipeline import SCHEDULES, simulate
    from ..views.text import render_pipeline

    if args.run:
        return _pipeline_run(args)
    for flag in ("stages", "microbatches"):
        if getattr(args, flag) is None:
            raise SpecError("", None, f"--{flag} is required (or give --run DIR of a pipelined run)")
    if args.schedule not in SCHEDULES:
        raise SpecError(
            "--schedule",
            args.schedule,
            "unknown schedule" + did_you_mean(args.schedule, SCHEDULES) + f"; choose one of {', '.join(SCHEDULES)}",
        )
    times = {
        name: _seconds(getattr(args, name), "--" + name.replace("_", "-"))
        for name in ("forward_s", "backward_s", "weight_s")
    }
    try:
        timeline = simulate(args.schedule, args.stages, args.microbatches, args.vpp, p2p_s=args.p2p_s, **times)
    except ValueError as err:  # the simulator's words, in the flags' names
        message = str(err)
        for name in ("forward_s", "backward_s", "weight_s", "p2p_s"):
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise SpecError("", None, message) from None
    result = timeline.to_dict()
    if args.html:
        from ..views.figures import pipeline_figure, write_html

        write_html(args.html, [pipeline_figure(result)])
    print(json.dumps(result, indent=2) if args.json else render_pipeline(result))
    return 0


def _pipeline_run(args) -> int:
    """A run's measured pipeline step against the same schedule simulated from the run's own chunk times."""
    from ..estimate.pipeline import replay
    from ..runs.folder import read_pipeline_timeline
    from ..views.text import render_pipeline

    measured = read_pipeline_timeline(args.run)
    if measured is None:
        raise SpecError(
            "--run",
            args.run,
            "holds no pipeline timeline (OUT/pipeline/rank*.json): it is written by "
            "`toolkit train --pp 2 ...` (pp > 1) at its third step",
        )
    simulated = replay(measured).to_dict()
    error = (simulated["step_s"] - measured["step_s"]) / measured["step_s"]
    result = {
        "measured": measured,
        "simulated": simulated,
        "step_s": {"simulated": simulated["step_s"], "measured": measured["step_s"], "error": error},
    }
    if args.html:
        from ..views.figures import pipeline_figure, write_html

        write_html(args.html, [pipeline_figure(simulated, measured)])
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"measured step {measured['step']} of {args.run}:")
        print(render_pipeline(measured))
        print("simulated from the measured chunk times:")
        print(render_pipeline(simulated))
        print(f"step: simulated {simulated['step_s']:.4g} s, measured {measured['step_s']:.4g} s, error {error:+.1%}")
    return 0


def _seconds(text: str | None, flag: str) -> float | list[float] | None:
    """'2' -> 2.0; '1,1.5,1' -> one value per virtual stage."""
    if text is None:
        return None
    try:
        values = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise SpecError(flag, text, "expected seconds, or one value per virtual stage separated by commas") from None
    return values[0] if len(values) == 1 else values
