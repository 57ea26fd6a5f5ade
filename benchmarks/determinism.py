"""The same job gives the same bits, whatever else the machine is doing (issue 17 item 2).

    .venv/bin/python benchmarks/determinism.py [--repeats 20] [--hogs 2]

Two jobs, each run `--repeats` times while `--hogs` processes multiply matrices on every core (each its own
OpenMP team, contending with the runs for the cores):

- the bitwise-resume test's job, one process started as `python -m toolkit.train.worker` (dropout 0.1, an
  evaluation every 4 steps, a DataLoader worker, 12 steps): the run that once differed in its last bits;
- a 2-rank DDP job through `toolkit train --nproc 2` (gloo), 8 steps.

Every run's losses, gradient norms and evaluation losses must equal the first run's bit for bit. Then the first job
is SIGKILLed at step 5 under the same load and resumed: its record must equal the uninterrupted one. What pins the
bits is toolkit/launch/determinism.py. About 10 minutes on 2 cores. Headline figures last.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.specs import Job  # noqa: E402
from toolkit.train.data import ensure_demo_corpus  # noqa: E402
from toolkit.train.launch import prepare_run  # noqa: E402

ONE = {
    "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32, "dropout": 0.1},
    "batch": {"micro_batch": 2, "global_batch": 4},
    "precision": {"mode": "fp32"},
    "training": {"steps": 12, "warmup_steps": 1, "lr": 1e-3, "checkpoint_every": 3, "eval_every": 4, "num_workers": 1},
}
TWO = [
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
    "--steps",
    "8",
    "--checkpoint-every",
    "0",
    "--nproc",
    "2",
]
HOG = "import torch\nx = torch.randn(384, 384)\nwhile True:\n    x = (x @ x).tanh()\n"


def record(out: Path) -> tuple:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return tuple((r["step"], r["loss"], r["grad_norm"], r.get("eval_loss")) for r in map(json.loads, lines))


def worker(out: Path) -> list[str]:
    return [sys.executable, "-m", "toolkit.train.worker", str(out / "job.yaml"), str(out), "--no-progress"]


def one_process(folder: Path, data: Path, name: str) -> Path:
    out = folder / name
    job = Job.from_dict({**ONE, "training": {**ONE["training"], "data": str(data)}})
    prepare_run(job, out, 1)
    return out


def run_one(folder: Path, data: Path, name: str) -> tuple:
    out = one_process(folder, data, name)
    subprocess.run(worker(out), check=True, timeout=600, cwd=ROOT, capture_output=True)
    return record(out)


def run_two(folder: Path, data: Path, name: str) -> tuple:
    out = folder / name
    subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "train", *TWO, "--data", str(data), "--out", str(out)],
        check=True,
        timeout=600,
        cwd=ROOT,
        capture_output=True,
    )
    return record(out)


def killed_and_resumed(folder: Path, data: Path) -> tuple:
    out = one_process(folder, data, "resumed")
    p = subprocess.Popen(worker(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 5:
        if p.poll() is not None:
            raise SystemExit("the run ended before step 5")
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(worker(out), check=True, timeout=600, cwd=ROOT, capture_output=True)
    return record(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="determinism-"))
    data = ensure_demo_corpus(folder / "cache")
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    began = time.monotonic()
    try:
        ones = [run_one(folder, data, f"one{i}") for i in range(args.repeats)]
        print(f"one process: {len(set(ones))} distinct record(s) in {len(ones)} runs", flush=True)
        twos = [run_two(folder, data, f"two{i}") for i in range(args.repeats)]
        print(f"2 ranks: {len(set(twos))} distinct record(s) in {len(twos)} runs", flush=True)
        resumed = killed_and_resumed(folder, data)
    finally:
        for hog in hogs:
            hog.kill()
    print(f"hogs: {args.hogs} matrix-multiplying processes beside every run; {time.monotonic() - began:.0f} s in all")
    print(f"runs: {args.repeats}")
    print(f"one-process runs identical: {str(len(set(ones)) == 1).lower()}")
    print(f"2-rank runs identical: {str(len(set(twos)) == 1).lower()}")
    print(f"resume under load equal: {str(resumed == ones[0]).lower()}")


if __name__ == "__main__":
    main()
