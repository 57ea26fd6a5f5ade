"""Start N rank processes on this host and watch them: the one launcher under `toolkit train`, `toolkit generate`
and calibrate's probes (the tracer's ranks share its environment and determinism, and start through
torch.multiprocessing because they run a function, not a module).

    workers = start_ranks(["python", "-m", "toolkit.train.worker", ...], nproc)
    exits = supervise(workers)          # SIGTERM/SIGINT reach every rank; the first to fail stops the others
    exits.failed[0]                     # {"rank", "code", "at_s"} of the first rank to fail, or none

Each rank gets torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and the pinned threads of
toolkit.launch.determinism, so a rank started here computes the same bits as one started by torchrun.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

from .determinism import pin_environment

__all__ = ["rank_env", "free_port", "start_ranks", "supervise", "describe_exit", "ExitOrder"]

AGREED_STOP_CODES = (2, 3)
"""Exit codes a rank uses for a stop every rank agreed on (a full disk, a diagnosis): the others are let finish."""


def rank_env(rank: int, nproc: int, port: int) -> dict:
    """This process's environment for rank `rank` of `nproc` on this host (torchrun's variables, the pinned
    threads of toolkit.launch.determinism)."""
    return dict(
        pin_environment(dict(os.environ), nproc),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(command: list[str], nproc: int, extra_env: dict | None = None, logs: Path | None = None) -> list:
    """`command` started once per rank with its rank's environment; with `logs`, each rank's output goes to
    logs/rank{N}.log (else it shares this process's)."""
    port = free_port()
    workers = []
    for rank in range(nproc):
        env = dict(rank_env(rank, nproc, port), **(extra_env or {}))
        if logs is None:
            workers.append(subprocess.Popen(command, env=env))
            continue
        log = open(logs / f"rank{rank}.log", "w", encoding="utf-8")  # noqa: SIM115 - the rank's, closed by the OS
        workers.append(subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True))
    return workers


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def supervise(workers: list, grace_s: float = 10.0) -> ExitOrder:
    """Wait for every rank, passing SIGTERM and SIGINT to all; when one fails, stop the others (after letting them
    finish an agreed stop) and return. The exit order says who failed first."""

    def forward(signum, _frame):
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    exits = ExitOrder(workers)
    try:
        while len(exits.order) < len(workers) and not exits.failed:
            exits.wait(0.2)
        if exits.failed:
            if exits.failed[0]["code"] in AGREED_STOP_CODES:
                _wait_all(workers, grace_s)
            _stop(workers, grace_s)
            exits.wait(0.5)
        return exits
    finally:
        exits.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(workers: list, grace_s: float) -> None:
    for w in workers:
        if w.poll() is None:
            w.terminate()
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            w.kill()


def _wait_all(workers: list, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for w in workers:
        try:
            w.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            return


class ExitOrder:
    """The order in which the ranks exit, stamped with a monotonic clock as each exits: a pidfd per process
    (Linux), which becomes readable the moment it dies, else polling every 10 ms. torch's elastic agent stamps
    exits in whole seconds and reports the lowest failed rank, which names the wrong rank when one rank's death
    brings down the others."""

    def __init__(self, workers: list):
        self.workers, self.start = workers, time.monotonic()
        self.order: list[dict] = []
        self.fds = {}
        for rank, w in enumerate(workers):
            try:
                self.fds[os.pidfd_open(w.pid)] = rank
            except (AttributeError, OSError):  # (no pidfd: polled below)
                pass

    @property
    def failed(self) -> list[dict]:
        """The ranks that exited non-zero, first to fail first."""
        return [e for e in self.order if e["code"] != 0]

    def wait(self, timeout_s: float) -> None:
        """Block until a rank exits (or `timeout_s`), then record, with the time, every rank that has exited."""
        pending = [fd for fd, rank in self.fds.items() if not self._seen(rank)]
        if len(self.fds) == len(self.workers):
            if pending:
                select.select(pending, [], [], timeout_s)
        else:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and not any(
                w.poll() is not None and not self._seen(r) for r, w in enumerate(self.workers)
            ):
                time.sleep(0.01)
        now = time.monotonic() - self.start
        for rank, w in enumerate(self.workers):
            if not self._seen(rank) and w.poll() is not None:
                self.order.append({"rank": rank, "code": w.returncode, "at_s": now})

    def _seen(self, rank: int) -> bool:
        return any(e["rank"] == rank for e in self.order)

    def write(self, path: Path) -> None:
        rows = [{**e, "signal": signal.Signals(-e["code"]).name if e["code"] < 0 else None} for e in self.order]
        path.write_text(json.dumps(rows, indent=1) + "\n")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = {}
