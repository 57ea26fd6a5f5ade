"""A run folder, written by the runner and read by the CLI and the widgets (no torch).

    OUT/job.yaml                  the job as trained (resolved layout: dp, tp, zero, ...)
    OUT/catalogs/NN-*.yaml        copies of the catalog files the run was started with (--catalog), if any
    OUT/metrics.jsonl             one line per optimizer step (METRICS_KEYS; written by toolkit.train.metrics)
    OUT/checkpoints/step_*.pt     (toolkit.checkpoint)
    OUT/memory/rank{r}.json       each rank's measured tensor memory over its first two steps
    OUT/pipeline/rank{r}.json     a pipelined run: when each of this stage's chunks ran in one step

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

from ..specs.errors import SpecError

__all__ = [
    "MEMORY_KEYS",
    "memory_file",
    "write_rank_memory",
    "read_rank_memory",
    "PIPELINE_KEYS",
    "write_stage_timeline",
    "read_pipeline_timeline",
    "run_catalog_files",
    "write_run_catalog",
    "METRICS_KEYS",
    "read_metrics",
    "MetricsTail",
    "damaged_lines_note",
]

RUN_CATALOGS = "catalogs"


def run_catalog_files(out_dir: str | Path) -> list[Path]:
    """The run's own catalog files, in order, for `load_catalog(*...)`: a job on a `toolkit calibrate` row (this
    machine) or another row of the user's resolves wherever the run is read (ranks, summary, compare, a rerun)."""
    return sorted((Path(out_dir) / RUN_CATALOGS).glob("*.yaml"))


def write_run_catalog(out_dir: str | Path, catalog_files) -> None:
    """Keep verbatim copies of the user's catalog files in the run folder (load_catalog merges them as it
    merged the originals)."""
    texts = [(Path(p).name, Path(p).read_text(encoding="utf-8")) for p in catalog_files]  # (before the folder goes)
    folder = Path(out_dir) / RUN_CATALOGS
    for old in run_catalog_files(out_dir):
        old.unlink()
    if texts:
        folder.mkdir(parents=True, exist_ok=True)
    for n, (name, text) in enumerate(texts):
        (folder / f"{n:02d}-{name}").write_text(text, encoding="utf-8")


MEMORY_KEYS = ("rank", "stage", "instrument", "steps", "peak_bytes", "categories")


def memory_file(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / "memory" / f"rank{rank}.json"


def write_rank_memory(out_dir: str | Path, record: dict) -> Path:
    """Write one rank's record atomically (a reader never sees half a file)."""
    missing = [k for k in MEMORY_KEYS if k not in record]
    if missing:
        raise ValueError(f"a memory record needs {missing}")
    return _write_json(memory_file(out_dir, record["rank"]), record)


def _write_json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def read_rank_memory(out_dir: str | Path) -> list[dict]:
    """Every rank's record, by rank; [] when the run recorded none (yet). A damaged file is named, with the fix."""
    records = _read_records(
        Path(out_dir) / "memory",
        MEMORY_KEYS,
        "memory record",
        "delete it and rerun the first two steps (or ignore the memory comparison)",
    )
    return sorted(records, key=lambda r: r["rank"])


def _read_records(folder: Path, keys: tuple[str, ...], what: str, fix: str) -> list[dict]:
    """The JSON records rank*.json of a run's folder, each checked for its keys; a damaged one is named."""
    records = []
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SpecError(str(path), type(err).__name__, f"is not a readable {what}; {fix}") from err
        if not isinstance(record, dict) or any(k not in record for k in keys):
            raise SpecError(str(path), "keys", f"a {what} needs {', '.join(keys)}; delete it")
        records.append(record)
    return records


PIPELINE_KEYS = ("stage", "step", "schedule", "stages", "microbatches", "vpp", "step_s", "spans")
"""A stage's timeline: `stage` is the pipeline rank; `spans` its chunks in the order run, each `kind` (F, B, W),
`micro`, `stage` (the virtual stage), `start_s`, `end_s` in seconds from the step's start (after a barrier of
the pipeline's ranks); `step_s` when the stage's part of the step ended."""


def write_stage_timeline(out_dir: str | Path, record: dict) -> Path:
    missing = [k for k in PIPELINE_KEYS if k not in record]
    if missing:
        raise ValueError(f"a pipeline timeline needs {missing}")
    return _write_json(Path(out_dir) / "pipeline" / f"rank{record['stage']}.json", record)


def read_pipeline_timeline(out_dir: str | Path) -> dict | None:
    """The measured step of the run's first pipeline, shaped as toolkit.estimate.pipeline's Timeline.to_dict()
    (`timeline` spans with their `rank`, step_s, busy_s, bubble_fraction); None when the run recorded none."""
    folder = Path(out_dir) / "pipeline"
    records = _read_records(folder, PIPELINE_KEYS, "pipeline timeline", "delete it (a rerun writes it again)")
    if not records:
        return None
    records.sort(key=lambda r: r["stage"])
    first = records[0]
    if [r["stage"] for r in records] != list(range(first["stages"])):
        raise SpecError(
            str(folder),
            [r["stage"] for r in records],
            f"needs one timeline per stage (0..{first['stages'] - 1}); rerun the step",
        )
    spans = [dict(span, rank=r["stage"]) for r in records for span in r["spans"]]
    step_s = max(r["step_s"] for r in records)
    busy_s = [sum(s["end_s"] - s["start_s"] for s in r["spans"]) for r in records]
    from ..estimate.pipeline import peak_in_flight

    return {
        "schedule": first["schedule"],
        "stages": first["stages"],
        "microbatches": first["microbatches"],
        "vpp": first["vpp"],
        "step": first["step"],
        "timeline": spans,
        "step_s": step_s,
        "busy_s": busy_s,
        "bubble_fraction": 1 - sum(busy_s) / (len(records) * step_s) if step_s > 0 else 0.0,
        "peak_in_flight": list(peak_in_flight([(s["rank"], s["kind"], s["start_s"]) for s in spans], len(records))),
    }


METRICS_KEYS = (
    "step",
    "loss",
    "lr",
    "tokens_per_s",
    "tflops",
    "mfu",
    "mem_bytes",
    "mem_kind",
    "grad_norm",
    "loss_scale",
    "skipped",
    "time_s",
    "wall_s",
)
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
        if stat.st_ino != self._inode or size < self._offset:  # replaced by a resume's rewrite: start over
            self.records, self.damaged, self._offset, self._lines, self._inode = [], [], 0, 0, stat.st_ino
        if size == self._offset:
            return 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        before = len(self.records)
        for line in complete.splitlines():
            self._lines += 1
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                record = None
            if isinstance(record, dict) and "step" in record:
                self.records.append(record)
            else:  # a line cut or overwritten: the lines after it still count
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
    return (
        f"{path}: line {shown} is not a JSON record (cut or overwritten); skipped, the other "
        f"{len(tail.records)} records are read"
    )
