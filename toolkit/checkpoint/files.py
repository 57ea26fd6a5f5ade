"""Checkpoints that survive a kill at any instant.

A checkpoint is `step_NNNNNNNN.pt` (torch.save of a dict) plus `step_NNNNNNNN.pt.sha256`. Each file
is written under a temporary name, fsync'd and renamed, the checksum last: a checkpoint without its
checksum file, or whose bytes do not match it, was interrupted or damaged, and is reported and skipped.
Files are loaded with `weights_only=True`: tensors, numbers, strings and containers only. Runs on several ranks
write their shards into `step_NNNNNNNN.dcp/` first (toolkit.checkpoint.sharded), the DeepSpeed backend its
partitions into `step_NNNNNNNN.ds/`; the .pt (naming that directory, with the shards' checksums) is their record.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .checksum import file_sha256

__all__ = [
    "save_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "resume_key",
    "unwritable_checkpoint",
    "file_sha256",
]

_NAME = re.compile(r"step_(\d{8})\.pt$")


def _fsync_write(path: Path, write) -> None:
    """Write under a temporary name and rename: a reader sees the whole file or none. A write that fails (a full
    disk) removes its temporary file, so the space it took is free again and nothing half-written remains."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _KeepsWriteErrors:
    """A file torch.save writes through, keeping the OS's error: torch reports a failed write (a full disk) as
    `RuntimeError: ... unexpected pos`, which names neither the cause nor the fix."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def _torch_save(state: dict, file) -> None:
    import torch

    keeper = _KeepsWriteErrors(file)
    try:
        torch.save(state, keeper)
    except RuntimeError:
        if keeper.error is not None:
            raise keeper.error from None
        raise


def save_checkpoint(folder: str | Path, step: int, state: dict, keep: int) -> Path:
    """Write `state` as the checkpoint of `step` and delete all but the newest `keep` valid ones."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:08d}.pt"
    try:
        _fsync_write(path, lambda f: _torch_save(state, f))
        digest = file_sha256(path)
        _fsync_write(path.with_name(path.name + ".sha256"), lambda f: f.write(digest.encode()))
    except BaseException:  # no checksum, no checkpoint: drop the unverifiable file
        path.unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)  # make the renames themselves durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)
        _remove_parts(old)
    return path


def _remove_parts(record: Path) -> None:
    """The folders a checkpoint's record names: sharded states (and their unfinished write), DeepSpeed's partitions."""
    for suffix in (".dcp", ".dcp.tmp", ".ds"):
        shutil.rmtree(record.with_suffix(suffix), ignore_errors=True)


def unwritable_checkpoint(folder: Path, step: int, error: OSError | None) -> str:
    """The one line every rank stops with when the checkpoint of `step` could not be written (on rank 0 the
    error; the other ranks only learn that it failed). Its partial files are removed; older ones stay."""
    _remove_parts(folder / f"step_{step:08d}.pt")  # its shards or partitions, if any
    valid = [p for p in list_checkpoints(folder) if p.with_name(p.name + ".sha256").exists()]
    kept = (
        f"the newest checkpoint, {valid[-1].name}, is intact and resumes" if valid else "no earlier checkpoint exists"
    )
    why = f"{error.strerror or error}" if error is not None else "it failed on another rank"
    return (
        f"the checkpoint of step {step} could not be written to {folder} ({why}); {kept}. Fix: free space "
        "(or point --out at a disk with room), then run the same command again"
    )


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Checkpoint files in step order (valid or not)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def latest_checkpoint(folder: str | Path, rank: int = 0, world: int = 1) -> tuple[dict | None, Path | None, list[str]]:
    """(state, path, problems): the newest checkpoint whose checksum matches, and one line for each
    newer one that was skipped (interrupted write, damaged file). With `world` ranks calling it together, each
    checks its share of a sharded checkpoint's files and they agree on the verdict (each file is read once)."""
    import torch

    problems = []
    from .sharded import sharded_problem

    for stale in Path(folder).glob("*.tmp") if Path(folder).is_dir() else []:
        problems.append(f"{stale.name}: unfinished write (the run stopped while saving); removed")
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)  # (every rank looks: another may have removed it first)
        else:
            stale.unlink(missing_ok=True)
    for path in reversed(list_checkpoints(folder)):
        sidecar = path.with_name(path.name + ".sha256")
        if not sidecar.exists():
            problems.append(f"{path.name}: no checksum file, the save was interrupted; skipped")
            continue
        if sidecar.read_text().strip() != file_sha256(path):
            problems.append(f"{path.name}: checksum mismatch, the file is damaged; skipped")
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a file that hashes right but does not load: report, keep looking
            problems.append(f"{path.name}: does not load ({type(exc).__name__}: {exc}); skipped")
            continue
        if state.get("dcp") and (problem := sharded_problem(Path(folder), state["dcp"], rank, world)):
            problems.append(f"{path.name}: {problem}; skipped")
            continue
        return state, path, problems
    return None, None, problems


def resume_key(job) -> tuple:
    """What a resumed run must share with the checkpoint: everything but the schedule and bookkeeping of
    the training section (steps, lr, warm-up, clipping, eval and checkpoint cadence may change; e.g. a
    lower lr after a divergence) and the parallel layout and device count (states are kept by parameter
    name, so a dp-4 run resumes on 2 ranks after spot instances are lost, or a ZeRO-3 one as replicas).
    Model, batch, precision, data, seed, pruning and FP32 norms may not change."""
    t = job.training
    return (
        job.replace(training=type(t)(), parallel=type(job.parallel)(), cluster=type(job.cluster)()),
        t.seed,
        t.data,
        t.pruning,
        t.fp32_norm,
    )
