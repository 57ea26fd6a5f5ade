"""A run folder, written by the runner and read by the CLI and the widgets (no torch).

    OUT/job.yaml                  the job as trained (resolved layout: dp, tp, zero, ...)
    OUT/metrics.jsonl             one line per optimizer step (toolkit.train.metrics)
    OUT/checkpoints/step_*.pt     (toolkit.train.checkpoint)
    OUT/memory/rank{r}.json       each rank's measured tensor memory over its first two steps

A memory record: `rank, stage, instrument, steps, peak_bytes, categories` and `states`. The instrument is
MemTracker over real tensors on CPU (the tracer's own instrument, so it shows the program is the one traced)
or torch.cuda's allocator statistics on a GPU. The peak is the second step's, as the trace measures it: by
then the optimizer's states exist; `categories` is the breakdown at that peak; `states` holds the parameters,
gradients and optimizer states the step kept.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .specs.errors import SpecError

__all__ = ["MEMORY_KEYS", "memory_file", "write_rank_memory", "read_rank_memory"]

MEMORY_KEYS = ("rank", "stage", "instrument", "steps", "peak_bytes", "categories")


def memory_file(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / "memory" / f"rank{rank}.json"


def write_rank_memory(out_dir: str | Path, record: dict) -> Path:
    """Write one rank's record atomically (a reader never sees half a file)."""
    missing = [k for k in MEMORY_KEYS if k not in record]
    if missing:
        raise ValueError(f"a memory record needs {missing}")
    path = memory_file(out_dir, record["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def read_rank_memory(out_dir: str | Path) -> list[dict]:
    """Every rank's record, by rank; [] when the run recorded none (yet). A damaged file is named, with the fix."""
    folder = Path(out_dir) / "memory"
    records = []
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SpecError(str(path), type(err).__name__, "is not a readable memory record; delete it and rerun "
                                                           "the first two steps (or ignore the memory comparison)")
        if not isinstance(record, dict) or any(k not in record for k in MEMORY_KEYS):
            raise SpecError(str(path), "keys", f"a memory record needs {', '.join(MEMORY_KEYS)}; delete it")
        records.append(record)
    return sorted(records, key=lambda r: r["rank"])
