"""Kill and resume one 2-rank run 20 times, at random steps, and check it ends as if nothing had happened.

    .venv/bin/python benchmarks/soak.py [--cycles 20] [--seed 0]

The same `toolkit train` command (a small GPT, 2 gloo ranks of DDP, fp32, a checkpoint every step) is started
again and again; each time, once it has logged one to three steps past its checkpoint, it is interrupted in one
of three ways, in turn: SIGKILL of a random rank, SIGTERM to the launcher (every rank checkpoints and stops),
SIGKILL of the launcher (its ranks notice and stop within 10 s). After the last cycle the command runs to the
end. The losses and gradient norms must equal, bit for bit, those of the same command run without
interruption, and every step must appear exactly once in metrics.jsonl. 2.4 minutes on 2 cores (AMD EPYC).
Headline figures last.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

FLAGS = [
    "--layers",
    "2",
    "--hidden",
    "64",
    "--heads",
    "4",
    "--vocab",
    "256",
    "--seq",
    "32",
    "--micro-batch",
    "2",
    "--global-batch",
    "4",
    "--precision",
    "fp32",
    "--warmup",
    "1",
    "--lr",
    "1e-3",
    "--no-progress",
    "--num-workers",
    "0",
    "--checkpoint-every",
    "1",
    "--nproc",
    "2",
]
ACTIONS = ("SIGKILL a rank", "SIGTERM the launcher", "SIGKILL the launcher")


def command(out: Path, data: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "toolkit.cli",
        "train",
        *FLAGS,
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--data",
        str(data),
    ]


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ranks(p: subprocess.Popen) -> list:
    try:
        return [c for c in psutil.Process(p.pid).children() if "toolkit.train.worker" in " ".join(c.cmdline())]
    except psutil.Error:  # (a child that exited while it was listed)
        return []


def interrupt(out: Path, data: Path, steps: int, action: str, rng: random.Random) -> tuple[int, float]:
    """Start the command, let it log 1-3 steps past where it stands, interrupt it; (steps logged, stop seconds)."""
    start = len(records(out))
    target = min(start + rng.randint(1, 3), steps - 1)
    p = subprocess.Popen(command(out, data, steps), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    ranks = []
    while len(records(out)) < target or len(ranks) < 2:
        if p.poll() is not None:
            raise SystemExit(
                f"the run ended before it was interrupted ({p.returncode}): {p.stderr.read().strip()[-400:]}"
            )
        if time.monotonic() > deadline:
            raise SystemExit("no progress in 300 s")
        if len(ranks) < 2:  # found while it starts: listing them after the target let a fast CPU run on
            ranks = _ranks(p)  # for 10 more steps, and once to its end, before the signal
        time.sleep(0.01)
    began = time.monotonic()
    if action == "SIGKILL a rank":
        rng.choice(ranks).send_signal(signal.SIGKILL)
    elif action == "SIGTERM the launcher":
        p.send_signal(signal.SIGTERM)
    else:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=120)
    _gone, alive = psutil.wait_procs(ranks, timeout=15)
    if alive:
        raise SystemExit(f"{action}: ranks {[c.pid for c in alive]} still running 15 s later")
    return len(records(out)), time.monotonic() - began


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--extra",
        default="",
        help='more train flags, e.g. "--zero 2 --precision mixed-bf16" (DeepSpeed\'s engine and its checkpoints)',
    )
    args = parser.parse_args(argv)
    FLAGS.extend(args.extra.split())
    from toolkit.train.data import ensure_demo_corpus

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    data = ensure_demo_corpus(work / "cache")
    # room for every cycle to stop the run mid-way: on a fast CPU a step takes ~10 ms, and ranks whose launcher was
    # killed notice within 0.5 s (their parent watch), so such a cycle runs on for up to ~50 steps
    steps = 40 * args.cycles
    ref, soak = work / "uninterrupted", work / "soak"
    done = subprocess.run(command(ref, data, steps), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr.strip()[-400:])
    rng = random.Random(args.seed)
    print(f"{'cycle':>5}  {'interruption':22} {'steps logged':>12} {'ranks gone in':>13}")
    stops, mid_run = [], 0
    for cycle in range(args.cycles):
        action = ACTIONS[cycle % len(ACTIONS)]
        logged, stop_s = interrupt(soak, data, steps, action, rng)
        stops.append(stop_s)
        mid_run += logged < steps
        print(f"{cycle + 1:5d}  {action:22} {logged:12d} {stop_s:12.1f}s", flush=True)
    final = subprocess.run(command(soak, data, steps), capture_output=True, text=True)
    if final.returncode:
        raise SystemExit(final.stderr.strip()[-400:])
    want, got = records(ref), records(soak)
    keys = ("step", "loss", "grad_norm")
    equal = [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in want]
    once = [r["step"] for r in got] == list(range(1, steps + 1))
    shutil.rmtree(work, ignore_errors=True)
    print(f"steps: {steps}")
    print(f"slowest stop after an interruption: {max(stops):.1f} s")
    print(f"each step once in metrics.jsonl: {str(once).lower()}")
    print(f"cycles that stopped the run before its last step: {mid_run}")
    print(f"cycles: {args.cycles}")
    print(f"losses equal: {str(equal).lower()}")
    return 0 if equal and once and mid_run == args.cycles else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
