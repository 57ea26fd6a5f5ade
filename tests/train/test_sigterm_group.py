"""SIGTERM to the run's whole process group, as `scancel` or a job manager sends it (`kill -- -PGID`): the
launcher, both ranks and their DataLoader workers get it at once. The ranks finish their step, checkpoint and
exit 0, and a rerun resumes from that checkpoint (issue 53, item 4)."""

import os
import signal
import subprocess
import sys
import time

import psutil

from toolkit.checkpoint import list_checkpoints
from toolkit.runs.folder import read_metrics

from .test_runner import FLAGS, wait_for_step


def _command(out, corpus, steps):
    """`toolkit train` on 2 ranks with one DataLoader worker each (the runner's flags say 0: the last one wins)."""
    flags = ["--steps", str(steps), "--global-batch", "4", "--nproc", "2", "--checkpoint-every", "0"]
    flags += ["--data", str(corpus), "--num-workers", "1"]
    return [sys.executable, "-m", "toolkit.cli", "train", *FLAGS, "--out", str(out), *flags]


def _group(pgid):
    """The processes still in process group `pgid` (zombies aside)."""
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def test_sigterm_to_the_process_group_checkpoints_exits_0_and_resumes(tmp_path, corpus):
    out = tmp_path / "run"
    run = subprocess.Popen(
        _command(out, corpus, 400), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_for_step(out / "metrics.jsonl", 2, run, timeout_s=60)
        loaders = [c for c in psutil.Process(run.pid).children(recursive=True) if c.ppid() != run.pid]
        assert len(loaders) == 2, "each rank should have one DataLoader worker"
        os.killpg(run.pid, signal.SIGTERM)
        signalled = time.monotonic()
        _stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, stderr
    assert time.monotonic() - signalled < 30
    assert "Traceback" not in stderr and "killed by signal" not in stderr, stderr
    logged = read_metrics(out / "metrics.jsonl")[-1]["step"]
    assert list_checkpoints(out / "checkpoints")[-1].name == f"step_{logged:08d}.pt"  # the finished step's
    deadline = time.monotonic() + 10
    while _group(run.pid) and time.monotonic() < deadline:  # (the data workers leave with their ranks)
        time.sleep(0.1)
    assert not _group(run.pid), "processes of the run outlived it"

    resumed = subprocess.run(_command(out, corpus, logged + 2), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step_{logged:08d}.pt" in resumed.stdout
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, logged + 3))
