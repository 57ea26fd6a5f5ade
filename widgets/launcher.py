"""The launcher panel: run a Job for real and watch it, the estimate drawn beside the measurement.

    from widgets.launcher import LauncherPanel
    run = LauncherPanel(job, out_dir="runs/nb", nproc=2)
    run              # Launch, Stop (SIGTERM: every rank checkpoints and exits), Resume

The run is a separate process (`toolkit train`, which starts the ranks), so the kernel and the
widgets never wait on training. A background thread reads the run's metrics.jsonl as lines arrive
and redraws the figure at most `max_redraws_per_s` times a second, all new lines in one update.
The run's errors (a refused job, a dead rank, a diagnosed divergence) appear in the panel. The memory chart
shows the process's memory and, once the ranks recorded them (their first two steps), each rank's tensor
peak beside the estimated peak: on CPU the RSS counts the interpreter and libraries, the markers compare
like with like.
"""

from __future__ import annotations

import html
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ipywidgets as W
import traitlets

from toolkit.estimate import Estimate, estimate_result
from toolkit.runs.folder import MetricsTail, read_rank_memory
from toolkit.specs import Job, SpecError
from toolkit.specs.dims import ParallelDims
from toolkit.train.launch import STARTER_ENV
from toolkit.views.figures import metrics_figure
from widgets.fallback import PanelText
from widgets.live_figure import LiveFigure

__all__ = ["LauncherPanel", "fresh_folder"]


class LauncherPanel(PanelText, W.VBox):
    panel_name = "the run launcher"

    state = traitlets.Unicode("ready")
    """ready, starting (no step yet), running, stopping, stopped, finished or failed; the buttons follow it."""

    def __init__(
        self,
        job: Job,
        out_dir: str | Path,
        nproc: int = 1,
        extra_args: tuple[str, ...] = (),
        max_redraws_per_s: float = 4.0,
    ):
        self.job, self.out, self.nproc = job, Path(out_dir), nproc
        self.extra_args = tuple(extra_args)
        self.min_redraw_s = 1.0 / max_redraws_per_s
        self.process: subprocess.Popen | None = None
        self.records: list[dict] = []
        self.rank_memory: list[dict] = []
        self.redraws = 0
        self._watcher: threading.Thread | None = None
        self._estimate = self._estimate_of(job, nproc)
        self.figure = LiveFigure(metrics_figure([], self._estimate))
        self._stop_requested = False
        self.status = W.HTML("ready")
        self.launch_button = W.Button(description="Launch", icon="play", button_style="success")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger", disabled=True)
        self.resume_button = W.Button(description="Resume", icon="redo", disabled=True)
        self.launch_button.on_click(lambda _b: self.launch())
        self.stop_button.on_click(lambda _b: self.stop())
        self.resume_button.on_click(lambda _b: self.resume())
        self.folder = W.HTML()
        super().__init__(
            [W.HBox([self.launch_button, self.stop_button, self.resume_button]), self.status, self.folder, self.figure]
        )

    @staticmethod
    def _estimate_of(job: Job, nproc: int) -> Estimate | None:
        """The estimate of the job as it will run: on nproc ranks, dp = nproc / (tp·pp), as `toolkit train` sets
        (the job as given where the ranks do not split so: the run will say why)."""
        try:
            job = ParallelDims.for_world(job, nproc).on_job(job)
        except SpecError:
            pass
        try:
            return estimate_result(job)
        except SpecError:
            return None

    # ---- process ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def launch(self) -> None:
        """Start the run. After a finished or failed run, Launch starts afresh in a new folder (run-2, run-3, ...)
        so that nothing of the last one is overwritten; Resume continues in the same folder."""
        if self.running:
            return
        if self.state in ("finished", "failed"):
            self.out = fresh_folder(self.out)
            self.records, self.rank_memory = [], []
        self._start()

    def resume(self) -> None:
        """Continue from the folder's newest checkpoint (a finished run only if the job now asks for more steps)."""
        if self.running:
            return
        done = self.records[-1]["step"] if self.records else 0
        if self.state == "finished" and self.job.training.steps <= done:
            self.status.value = (
                f"finished at step {done}: nothing to resume (raise training.steps to continue, or Launch a new run)"
            )
            return
        self._start()

    def _start(self) -> None:
        self._stop_requested = False
        self.out.mkdir(parents=True, exist_ok=True)
        request = self.out / "launch.yaml"
        self.job.to_yaml(request)
        command = [
            sys.executable,
            "-m",
            "toolkit.cli",
            "train",
            "--config",
            str(request),
            "--out",
            str(self.out),
            "--nproc",
            str(self.nproc),
            "--no-progress",
            *self.extra_args,
        ]
        self._log = open(self.out / "launcher.log", "a")  # (a resume adds to the log of the run)
        errors = self.out / "launcher.err"
        self._err_from = errors.stat().st_size if errors.exists() else 0
        self._err = open(errors, "a")
        # a session of its own: the kernel's shutdown signal (its process group's) reaches neither the ranks nor
        # their DataLoader workers; the run learns the kernel has gone from STARTER_ENV and stops as Stop does
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=self._err,
            text=True,
            start_new_session=True,
            env={**os.environ, STARTER_ENV: str(os.getpid())},
        )
        self.status.value = f"starting: {html.escape(' '.join(command[2:]))}"
        self.folder.value = _folder_html(self.out, self.job)
        self._set_state("starting")
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Ask the run to stop: every rank finishes its step, saves a checkpoint and exits."""
        if self.running:
            self._stop_requested = True
            self.process.send_signal(signal.SIGTERM)
            self._set_state("stopping")
            self.status.value = "stopping: the ranks finish their step and checkpoint"

    def wait(self, timeout_s: float = 300) -> int | None:
        """Block until the run and the watcher end (for scripts and tests; the panel never needs it)."""
        if self.process is not None:
            self.process.wait(timeout=timeout_s)
        if self._watcher is not None:
            self._watcher.join(timeout=timeout_s)
        return None if self.process is None else self.process.returncode

    # ---- watching ----------------------------------------------------------------------------------
    def _watch(self) -> None:
        tail = MetricsTail(self.out / "metrics.jsonl")
        last_draw, seen, shown = 0.0, -1, False
        while True:
            alive = self.running
            tail.poll()
            if not shown and self.state == "starting":
                shown = self._show_rank_command()
            now = time.monotonic()
            if len(tail.records) != seen and (now - last_draw >= self.min_redraw_s or not alive):
                self.records, seen, last_draw = list(tail.records), len(tail.records), now
                self._redraw()
            if not alive:
                break
            time.sleep(0.05)
        self._finished()

    def _show_rank_command(self) -> bool:
        """Where `toolkit train` starts the ranks through `accelerate launch` (CUDA GPUs), show its command."""
        log = self.out / "launcher.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        command = next((line for line in reversed(lines) if line.startswith("starting: accelerate launch")), None)
        if command:
            self.folder.value += f"<br><small>ranks: <code>{html.escape(command[len('starting: ') :])}</code></small>"
        return command is not None

    def _redraw(self) -> None:
        if len(self.rank_memory) < self.nproc:  # (written once, after each rank's second step)
            self.rank_memory = read_rank_memory(self.out)
        fig = metrics_figure(self.records, self._estimate, self.rank_memory)
        with self.figure.batch_update():
            if len(self.figure.data) != len(fig.data):
                self.figure.data = []
                self.figure.add_traces(list(fig.data))
            else:
                for old, new in zip(self.figure.data, fig.data):
                    old.update(x=new.x, y=new.y)
        self.redraws += 1
        last = self.records[-1] if self.records else None
        if last and self.state == "starting":
            self._set_state("running")
        if last and self.running and self.state == "running":
            self.status.value = (
                f"running: step {last['step']}, loss {last['loss'] if last['loss'] is None else round(last['loss'], 4)}, "
                f"{last.get('tokens_per_s') or 0:,.0f} tokens/s"
            )

    def _finished(self) -> None:
        code = self.process.returncode
        self._log.close()
        self._err.close()
        with open(self.out / "launcher.err", errors="replace") as f:
            f.seek(self._err_from)
            stderr = f.read()
        lines = [line for line in stderr.splitlines() if line.strip()]
        steps = self.records[-1]["step"] if self.records else 0
        if code == 0 and steps >= self.job.training.steps:
            state, message = "finished", f"finished: all {steps} steps; checkpoint saved (Launch starts a new run)"
        elif code == 0:
            state, message = "stopped", f"stopped cleanly at step {steps}; checkpoint saved (Resume continues)"
        else:
            shown = "<br>".join(html.escape(line) for line in lines[-5:]) or f"exit code {code}"
            state = "failed"
            message = f"<span style='color:#d62728'><b>failed (exit {code}) after step {steps}:</b><br>{shown}</span>"
        self.status.value = message
        self._set_state(state)

    def _set_state(self, state: str) -> None:
        """The buttons a state offers: Launch when nothing runs and nothing waits to resume, Stop while it runs,
        Resume after a stop (or a failure that left a checkpoint)."""
        self.state = state
        resumable = state == "stopped" or (state == "failed" and any((self.out / "checkpoints").glob("step_*")))
        self.launch_button.disabled = state not in ("ready", "finished", "failed")
        self.stop_button.disabled = state not in ("starting", "running")
        self.resume_button.disabled = not resumable


def fresh_folder(out: Path) -> Path:
    """The first of out, out-2, out-3, ... that does not exist: a new run never writes into an old one."""
    if not out.exists():
        return out
    n = 2
    while out.with_name(f"{out.name}-{n}").exists():
        n += 1
    return out.with_name(f"{out.name}-{n}")


def _folder_html(out: Path, job: Job) -> str:
    """Where the run writes: its log, metrics and checkpoints, and how to open a tracker's logs."""
    where = html.escape(str(out.resolve()))
    line = f"<small>run folder <code>{where}</code>: launcher.log, metrics.jsonl, checkpoints/, memory/"
    if "tensorboard" in job.training.trackers:
        line += f"; TensorBoard: <code>tensorboard --logdir {where}</code>"
    return line + "</small>"
