"""The metrics stream's writer: one JSON line per optimizer step in DIR/metrics.jsonl, written by rank 0.

Widgets, the CLI and tests read the same file while the run goes on (toolkit.runs.folder.read_metrics), so every line
is flushed as soon as it is written and a reader ignores a last line that is still incomplete. After a resume
from step s the lines after s are dropped before training continues: each step appears once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..runs.folder import damaged_lines_note, read_metrics

__all__ = ["MetricsLog", "memory_reading"]


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
