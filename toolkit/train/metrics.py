"""The metrics stream: one JSON line per optimizer step in DIR/metrics.jsonl, written by rank 0.

Widgets, the CLI and tests read the same file while the run goes on, so every line is flushed
as soon as it is written and a reader ignores a last line that is still incomplete. After a resume
from step s the lines after s are dropped before training continues: each step appears once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["MetricsLog", "MetricsTail", "read_metrics", "memory_reading"]

KEYS = ("step", "loss", "lr", "tokens_per_s", "tflops", "mfu", "mem_bytes", "mem_kind", "grad_norm",
        "loss_scale", "skipped", "time_s", "wall_s")
"""Every line has these; `eval_loss` when evaluated, `mem_base_bytes` on the first line of a (resumed)
process, `skipped_total` on a skipped step. time_s is the step's own duration; wall_s the seconds since
this process began its training loop, so that overheads between steps show too."""


def read_metrics(path: str | Path) -> list[dict]:
    """Every complete line of a metrics file (a line still being written is left out)."""
    tail = MetricsTail(path)
    tail.poll()
    return tail.records


class MetricsTail:
    """Follows a metrics file as it grows, reading only the new complete lines each time (a live plot's
    reader: polling a long run must not re-read it from the start). A resumed run replaces the file
    (a new inode): then the tail starts over and `records` is rebuilt."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.records: list[dict] = []
        self._offset = 0
        self._inode = None

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many records arrived."""
        if not self.path.exists():
            return 0
        stat = self.path.stat()
        size = stat.st_size
        if stat.st_ino != self._inode or size < self._offset:    # replaced by a resume's rewrite: start over
            self.records, self._offset, self._inode = [], 0, stat.st_ino
        if size == self._offset:
            return 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[:chunk.rfind(b"\n") + 1]        # a line still being written waits for the next poll
        before = len(self.records)
        for line in complete.splitlines():
            try:
                self.records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        self._offset += len(complete)
        return len(self.records) - before


class MetricsLog:
    def __init__(self, path: str | Path, resume_step: int):
        self.path = Path(path)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def memory_reading(device) -> tuple[int, str]:
    """(bytes, kind): the allocator's peak since the last reset on CUDA; the process's resident set
    size on CPU, which also counts the interpreter and libraries (a named substitute, not tensor bytes)."""
    if device.type == "cuda":
        import torch
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    import psutil
    return int(psutil.Process().memory_info().rss), "rss"
