"""The metrics stream: one JSON line per optimizer step in DIR/metrics.jsonl, written by rank 0.

Widgets, the CLI and tests read the same file while the run goes on, so every line is flushed
as soon as it is written and a reader ignores a last line that is still incomplete. After a resume
from step s the lines after s are dropped before training continues: each step appears once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["MetricsLog", "MetricsTail", "read_metrics", "memory_reading", "damaged_lines_note"]

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
        self.damaged: list[int] = []
        """Line numbers (from 1) of complete lines that are not JSON records: skipped, never the end of reading."""
        self._offset = 0
        self._lines = 0
        self._inode = None

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many records arrived."""
        if not self.path.exists():
            return 0
        stat = self.path.stat()
        size = stat.st_size
        if stat.st_ino != self._inode or size < self._offset:    # replaced by a resume's rewrite: start over
            self.records, self.damaged, self._offset, self._lines, self._inode = [], [], 0, 0, stat.st_ino
        if size == self._offset:
            return 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[:chunk.rfind(b"\n") + 1]        # a line still being written waits for the next poll
        before = len(self.records)
        for line in complete.splitlines():
            self._lines += 1
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                record = None
            if isinstance(record, dict) and "step" in record:
                self.records.append(record)
            else:                           # a line cut or overwritten: the lines after it still count
                self.damaged.append(self._lines)
        self._offset += len(complete)
        return len(self.records) - before


def damaged_lines_note(path: str | Path) -> str | None:
    """One line when a metrics file has damaged lines (which the readers skip), naming them and the fix."""
    tail = MetricsTail(path)
    tail.poll()
    if not tail.damaged:
        return None
    shown = ", ".join(map(str, tail.damaged[:5])) + (" …" if len(tail.damaged) > 5 else "")
    return (f"{path}: line {shown} is not a JSON record (cut or overwritten); skipped, the other "
            f"{len(tail.records)} records are read")


class MetricsLog:
    """Rank 0's writer. On a resume it keeps the records up to the checkpoint's step; a file with damaged lines
    is first copied aside (`metrics.jsonl.damaged`), so that rewriting it loses nothing."""

    def __init__(self, path: str | Path, resume_step: int):
        self.path = Path(path)
        self.note = damaged_lines_note(self.path) if self.path.exists() else None
        if self.note:
            backup = self.path.with_name(self.path.name + ".damaged")
            backup.write_bytes(self.path.read_bytes())
            self.note += f"; the file as it was is kept in {backup.name}"
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
