"""The runner as users start it: real processes, real signals, real gloo ranks.

Each case launches `toolkit train` (or one worker) as a subprocess, because what is tested is what
happens to processes: a SIGKILL at any step, a dead rank, a refused job. SIGTERM (every rank checkpoints,
a rerun continues step by step) is the launcher panel's Stop and Resume in tests/browser, and, bit for bit
over 20 interruptions, benchmarks/soak.py.
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from toolkit.runs.folder import read_metrics
from toolkit.train.launch import prepare_run

from .conftest import tiny_job

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
    "--precision",
    "fp32",
    "--warmup",
    "1",
    "--lr",
    "1e-3",
    "--no-progress",
    "--num-workers",
    "0",
]


def toolkit_train(out, *extra, wait=True, env=None):
    command = [sys.executable, "-m", "toolkit.cli", "train", *FLAGS, "--out", str(out), *extra]
    environ = {**os.environ, **(env or {})}
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ)


def train_here(out, *extra):
    """The same command run in this process, for one-process runs and refusals: no new interpreter and no ~4 s of
    imports to pay (the suite's 12 minutes). Returns what subprocess.run would: returncode, stdout, stderr."""
    from toolkit.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    environ = dict(os.environ)  # (a run sets variables for its libraries, e.g. DeepSpeed's LOCAL_RANK:
    try:  # they must not reach what this worker starts next, such as a kernel)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["train", *FLAGS, "--out", str(out), *extra])
    except SystemExit as done:  # (argparse's usage errors)
        code = done.code
    finally:
        import torch.distributed as dist

        if dist.is_initialized():  # (one process's gloo group: the tracer in this worker needs none)
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(["toolkit", "train"], code, stdout.getvalue(), stderr.getvalue())


def wait_for_step(path, step, process, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while len(read_metrics(path)) < step:
        assert process.poll() is None, f"the run ended early: {process.communicate()}"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)


def _losses(out):
    return [(r["step"], r["loss"], r["grad_norm"], r.get("eval_loss")) for r in read_metrics(out / "metrics.jsonl")]


def test_sigkill_at_any_step_then_resume_is_bitwise_identical(tmp_path, corpus):
    """Dropout on, eval on, a DataLoader worker: RNG, data position, optimizer and eval all come back. Its three runs
    (reference, killed, resumed) share the 2 cores with the other test worker's ranks; the same job 20 times beside
    CPU hogs, and its resume, bit for bit: benchmarks/determinism.py (toolkit/launch/determinism.py pins the bits)."""
    job = tiny_job(
        model={"dropout": 0.1},
        training={"steps": 12, "checkpoint_every": 3, "eval_every": 4, "num_workers": 1, "data": str(corpus)},
    )
    ref, run = tmp_path / "ref", tmp_path / "run"
    for out in (ref, run):
        prepare_run(job, out, 1)
    worker = [sys.executable, "-m", "toolkit.train.worker"]
    subprocess.run(worker + [str(ref / "job.yaml"), str(ref), "--no-progress"], check=True, timeout=300)
    # between checkpoints: steps after the checkpoint are redone (20 kills at random steps: benchmarks/soak.py)
    p = subprocess.Popen(worker + [str(run / "job.yaml"), str(run), "--no-progress"])
    wait_for_step(run / "metrics.jsonl", 5, p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(worker + [str(run / "job.yaml"), str(run), "--no-progress"], check=True, timeout=300)
    assert _losses(run) == _losses(ref)
    assert [s for s, *_ in _losses(run)] == list(range(1, 13))  # each step once


def test_two_gloo_ranks_equal_one_process_with_the_same_global_batch(tmp_path, corpus):
    one = train_here(
        tmp_path / "one", "--steps", "6", "--global-batch", "8", "--eval-every", "3", "--data", str(corpus)
    )
    two = toolkit_train(
        tmp_path / "two",
        "--steps",
        "6",
        "--global-batch",
        "8",
        "--eval-every",
        "3",
        "--data",
        str(corpus),
        "--nproc",
        "2",
    )
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(a) == len(b) == 6
    for (s1, l1, g1, e1), (s2, l2, g2, e2) in zip(a, b):
        assert s1 == s2 and l1 == pytest.approx(l2, rel=1e-5) and g1 == pytest.approx(g2, rel=1e-4)
        assert (e1 is None) == (e2 is None) and (e1 is None or e1 == pytest.approx(e2, rel=1e-5))
    assert "2 rank(s)" in two.stdout and "memory/rank" in two.stdout


@pytest.mark.slow  # a further point beside the one above: make test-slow (make test keeps its 12 minutes)
def test_two_ranks_all_reduce_fp32_main_gradients(tmp_path, corpus):
    """Without DDP the runner all-reduces the main gradients itself: two ranks train as one process does (bf16
    weights, so to a few ulps; a missing or unscaled all-reduce moves the gradient norm by tens of per cent)."""
    args = (
        "--steps",
        "3",
        "--global-batch",
        "8",
        "--precision",
        "mixed-bf16",
        "--grad-dtype",
        "fp32",
        "--data",
        str(corpus),
    )
    one = train_here(tmp_path / "one", *args)
    two = toolkit_train(tmp_path / "two", *args, "--nproc", "2")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    for (s1, l1, g1, _), (s2, l2, g2, _) in zip(_losses(tmp_path / "one"), _losses(tmp_path / "two"), strict=True):
        assert s1 == s2 and l1 == pytest.approx(l2, rel=1e-3) and g1 == pytest.approx(g2, rel=1e-2)


def _two_ranks_running(out, corpus, checkpoint_every, step):
    """A long 2-rank run, once `step` steps are logged: (the launcher, its ranks)."""
    p = toolkit_train(
        out,
        "--steps",
        "400",
        "--global-batch",
        "4",
        "--nproc",
        "2",
        "--checkpoint-every",
        str(checkpoint_every),
        "--data",
        str(corpus),
        wait=False,
    )
    wait_for_step(out / "metrics.jsonl", step, p)
    ranks = [c for c in psutil.Process(p.pid).children() if "toolkit.train.worker" in " ".join(c.cmdline())]
    assert len(ranks) == 2
    return p, ranks


def test_a_killed_rank_stops_the_run_and_names_the_checkpoint(tmp_path, corpus):
    out = tmp_path / "run"
    p, ranks = _two_ranks_running(out, corpus, checkpoint_every=2, step=3)
    rank1 = next(c for c in ranks if c.environ().get("RANK") == "1")
    os.kill(rank1.pid, signal.SIGKILL)
    _stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 1
    assert "rank 1 was killed by SIGKILL" in stderr and "step_0000000" in stderr and "resume" in stderr
    assert "Traceback" not in stderr, stderr  # the peer's failed collective is kept in errors/, not printed
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in ranks)
    first = json.loads((out / "exits.json").read_text())[0]  # the order the ranks died in
    assert (first["rank"], first["signal"]) == (1, "SIGKILL")


def test_a_killed_launcher_leaves_no_rank_behind(tmp_path, corpus):
    p, ranks = _two_ranks_running(tmp_path / "run", corpus, checkpoint_every=50, step=2)
    p.kill()
    p.communicate()
    killed = time.monotonic()
    _gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, f"orphaned ranks: {[c.pid for c in alive]}"
    assert time.monotonic() - killed < 10


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--pp", "2", "--zero", "3", "--offload", "params", "--precision", "mixed-bf16", "--nproc", "2"],
            "Megatron's program (estimated only)",
        ),
        (["--pp", "2", "--nproc", "2", "--global-batch", "2"], "1 micro-batches per step for 2 stages"),
        (
            ["--pp", "2", "--vpp", "2", "--schedule", "gpipe", "--layers", "4", "--nproc", "2"],
            "interleaved stages (vpp > 1) run the interleaved 1F1B schedule",
        ),
        (
            ["--tp", "2", "--precision", "mixed-bf16", "--nproc", "2"],
            "mixed-bf16 with tensor or pipeline parallelism is Megatron's program (estimated only)",
        ),
        (
            ["--backend", "deepspeed", "--zero", "2", "--precision", "amp-bf16", "--nproc", "2"],
            "--backend: parallel.backend = 'deepspeed': DeepSpeed's program is modelled for the mixed-* modes and fp32",
        ),
        (["--zero", "2", "--precision", "mixed-fp16", "--nproc", "2"], "DeepSpeed runs fp16 on GPUs only"),
        (["--tp", "3", "--nproc", "3"], "--tp: parallel.tp = 3: must divide model.heads = 4"),
        (["--tp", "2", "--nproc", "3"], "--nproc = 3: must be a multiple of tp × pp = 2"),
        (["--dp", "3", "--nproc", "2"], "parallel.dp = 3: the job asks for dp × tp × pp = 3 ranks but --nproc = 2"),
        (["--data", "/nonexistent/shards"], "holds no index.json"),
        (["--global-batch", "3"], "must be a multiple of micro_batch × dp"),
        (["--steps", "0"], "training.steps = 0: must be greater than zero"),
        (["--vocab", "100"], "is smaller than the data's vocabulary"),
    ],
)
def test_bad_jobs_fail_before_any_process_starts(tmp_path, extra, message):
    result = train_here(tmp_path / "run", *extra)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_resuming_a_different_job_is_refused(tmp_path, corpus):
    out = tmp_path / "run"
    assert train_here(out, "--steps", "2", "--global-batch", "4", "--data", str(corpus)).returncode == 0
    other = train_here(out, "--steps", "4", "--global-batch", "4", "--hidden", "128", "--data", str(corpus))
    assert other.returncode == 2 and "holds checkpoints of a different job" in other.stderr
    longer = train_here(out, "--steps", "4", "--global-batch", "4", "--data", str(corpus))
    assert longer.returncode == 0 and [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_job_the_host_cannot_hold_is_refused_in_one_line_before_any_rank_starts(tmp_path):
    """48 blocks 4096 wide on 2 ranks need ~333 GiB: refused with what it needs, what the host has and the way out
    (--force), before a rank starts or the output folder is made."""
    out = tmp_path / "big"
    argv = [
        "train",
        "--layers",
        "48",
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--vocab",
        "256",
        "--seq",
        "512",
        "--steps",
        "20",
        "--warmup",
        "2",
        "--nproc",
        "2",
        "--out",
        str(out),
    ]
    result = subprocess.run([sys.executable, "-m", "toolkit.cli", *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "GiB of this host's memory" in result.stderr and "or --force to start anyway" in result.stderr
    assert not out.exists()
