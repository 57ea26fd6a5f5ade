"""The launcher panel: a real run in a subprocess, watched from a thread, stopped while it trains."""

import time

from toolkit.runs.folder import read_rank_memory
from toolkit.specs import Job
from widgets.launcher import LauncherPanel
from widgets.planner import PlannerPanel


def _job(steps=2000):
    return Job.from_dict(
        {
            "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
            "batch": {"micro_batch": 2, "global_batch": 4},
            "precision": {"mode": "fp32"},
            "training": {"steps": steps, "warmup_steps": 1, "num_workers": 0},
        }
    )


def test_stop_during_a_run_checkpoints_and_the_kernel_stays_responsive(tmp_path):
    panel = LauncherPanel(_job(), tmp_path / "run", nproc=2)
    panel.launch()
    deadline = time.monotonic() + 120
    while len(panel.records) < 3:
        assert time.monotonic() < deadline and panel.running, panel.status.value
        time.sleep(0.05)
    # the kernel's thread is free while training runs: a planner redraw answers within seconds (it shares 2 cores
    # with two training ranks and, under make test, another test file: 0.78 s seen), not at the end of a
    # 2000-step run, and the watcher draws new steps meanwhile
    drawn = len(panel.records)
    planner = PlannerPanel()
    planner.controls["micro_batch"].value = 4
    assert planner.last_update_s < 2.0 and panel.running
    while len(panel.records) <= drawn:
        assert time.monotonic() < deadline and panel.running, panel.status.value
        time.sleep(0.05)
    panel.stop()
    assert panel.wait(120) == 0
    step = panel.records[-1]["step"]
    assert (tmp_path / "run" / "checkpoints" / f"step_{step:08d}.pt").exists()
    assert "stopped cleanly" in panel.status.value and not panel.resume_button.disabled
    assert panel.state == "stopped" and panel.launch_button.disabled and panel.stop_button.disabled
    assert len(panel.figure.data[0].x) == step  # every line drawn
    assert panel.redraws <= 4 * 60  # rate-limited, not one redraw per line
    # each rank's tensor peak (what the estimate measures, unlike the process's RSS) beside the estimated peak
    peaks = next(t for t in panel.figure.data if t.name.startswith("tensor peak per rank"))
    estimated = next(t for t in panel.figure.data if t.name == "estimated peak (tensors)")
    recorded = read_rank_memory(tmp_path / "run")
    assert [r["rank"] for r in recorded] == [0, 1] and list(peaks.x) == [2, 2]
    assert list(peaks.y) == [r["peak_bytes"] / 2**30 for r in recorded]
    assert abs(peaks.y[0] - estimated.y[0]) / peaks.y[0] < 0.25  # like with like (RSS is ~8x the tensors)
    rss = next(t for t in panel.figure.data if t.name.startswith("measured"))
    assert max(rss.y) > 5 * max(peaks.y) and rss.yaxis != peaks.yaxis  # each on its own axis, both visible


def test_resume_continues_where_it_stopped(tmp_path):
    panel = LauncherPanel(_job(steps=6), tmp_path / "run")
    assert panel.state == "ready" and not panel.launch_button.disabled and panel.resume_button.disabled
    panel.launch()
    assert panel.state in ("starting", "running") and panel.launch_button.disabled and not panel.stop_button.disabled
    assert panel.wait(120) == 0
    assert [r["step"] for r in panel.records] == list(range(1, 7))
    # finished: Launch again (a new folder), no Resume; resuming anyway starts nothing
    assert panel.state == "finished" and not panel.launch_button.disabled and panel.resume_button.disabled
    process = panel.process
    panel.resume()
    assert panel.process is process and "nothing to resume" in panel.status.value
    panel.job = _job(steps=8)
    panel.resume_button.click()
    assert panel.wait(120) == 0
    assert [r["step"] for r in panel.records] == list(range(1, 9))


def test_a_failed_run_shows_its_error(tmp_path):
    job = _job()
    bad = job.replace(
        parallel=job.parallel.__class__(tp=2), precision=job.precision.__class__(mode="mixed-bf16")
    )  # (one process for a tp-2 layout)
    panel = LauncherPanel(bad, tmp_path / "run")
    panel.launch()
    assert panel.wait(120) == 2
    assert "failed (exit 2)" in panel.status.value and "must be a multiple of tp × pp = 2" in panel.status.value
    assert panel.state == "failed" and not panel.launch_button.disabled and panel.resume_button.disabled
    assert str((tmp_path / "run").resolve()) in panel.folder.value and "launcher.log" in panel.folder.value


def test_a_new_launch_after_a_run_never_writes_into_it(tmp_path):
    from widgets.launcher import fresh_folder

    (tmp_path / "run").mkdir()
    (tmp_path / "run-2").mkdir()
    assert fresh_folder(tmp_path / "run") == tmp_path / "run-3"


def test_the_memory_chart_puts_the_process_and_the_tensors_on_separate_labelled_axes():
    """On a CPU the process (~0.4 GiB) holds far more than the tensors (~0.01 GiB) the estimate and the per-rank
    markers compare: each gets its own axis, named, so neither is flattened onto zero."""
    from toolkit.views.figures import metrics_figure

    records = [{"step": s, "loss": 3.0, "tokens_per_s": 10.0, "mem_bytes": 4e8, "mem_kind": "rss"} for s in (1, 2)]
    ranks = [{"rank": 0, "stage": 0, "steps": [1, 2], "peak_bytes": 1e7, "instrument": "MemTracker"}]
    fig = metrics_figure(records, None, ranks)
    axis_of = {trace.name: trace.yaxis for trace in fig.data}
    assert axis_of["measured (rss)"] != axis_of["tensor peak per rank (MemTracker)"]
    assert fig.layout.yaxis4.title.text == "process, GiB (rss)" and fig.layout.yaxis5.title.text == "tensors, GiB"
    assert fig.layout.yaxis4.type != "log"


KERNEL = """
import sys, time
from toolkit.specs import Job
from widgets.launcher import LauncherPanel
job = Job.from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
                     "batch": {"micro_batch": 2, "global_batch": 4}, "precision": {"mode": "fp32"},
                     "training": {"steps": 2000, "warmup_steps": 1, "num_workers": 1, "checkpoint_every": 0}})
panel = LauncherPanel(job, sys.argv[1], nproc=2)
panel.launch()
while len(panel.records) < 3:
    time.sleep(0.05)
print("running", flush=True)
time.sleep(600)
"""


def test_a_kernel_shut_down_mid_run_leaves_a_checkpoint_at_the_last_finished_step(tmp_path):
    """A stand-in kernel (its own process group, as Jupyter starts kernels) launches a 2-rank run with a DataLoader
    worker per rank, then its whole group is killed as a kernel shutdown does. The run, in a session of its own, is
    not hit by that signal; it sees its starter gone, stops as Stop does, and checkpoints the last finished step."""
    import os
    import signal
    import subprocess
    import sys

    from toolkit.checkpoint import list_checkpoints
    from toolkit.runs.folder import read_metrics

    out = tmp_path / "run"
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, str(out)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert kernel.stdout.readline().strip() == "running"
    os.killpg(kernel.pid, signal.SIGTERM)  # the kernel's group: the kernel, not the run
    kernel.wait(30)
    deadline = time.monotonic() + 120
    log = out / "launcher.err"
    while "stopping at the end of the current step" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    while not list_checkpoints(out / "checkpoints") or any(out.glob("checkpoints/*.tmp")):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(2)  # (the ranks exit after their checkpoint; nothing more is written)
    last = read_metrics(out / "metrics.jsonl")[-1]["step"]
    assert list_checkpoints(out / "checkpoints")[-1].name == f"step_{last:08d}.pt"
    assert "Traceback" not in log.read_text() and "killed by signal" not in log.read_text()
