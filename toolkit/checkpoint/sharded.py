"""Sharded checkpoints: every rank writes its own shards with torch.distributed.checkpoint (DCP); no rank gathers
the model or the optimizer (a 7B model's fp32 weights and AdamW moments are 12 bytes a parameter, 84 GB: gathered
on rank 0 they would not fit).

    record = save_sharded(prog, folder, step, rank)     # every rank; rank 0 gets {"dir", "files"} for the .pt
    load_sharded(prog, folder / record["dir"])          # every rank, on any layout and number of ranks

One key space, whatever the layout: `model/<name>` and `optim/<name>/<state>`, with the whole model's parameter
names. FSDP2 and tensor-parallel DTensors are written as this rank's shards, replicas' tensors once (DCP keeps one
copy of a key written by several ranks), pipeline stages under their blocks' names in the whole model (a tied head's
optimizer states under the embedding's name, as one process keeps them), and torch's ZeRO-1 as each rank's partition
of whole tensors. DCP re-cuts the shards for the layout that loads them: dp 4 -> 2, ZeRO-3 -> pipeline stages, ...

The files are written into `step_N.dcp.tmp/`; rank 0 then takes their checksums (the manifest, kept in the step's
checksummed .pt record: toolkit.checkpoint) and renames the folder `step_N.dcp/`. A folder whose files do not
match the manifest is reported and its checkpoint skipped.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from .checksum import file_sha256

__all__ = ["uses_sharded_checkpoint", "save_sharded", "load_sharded", "sharded_problem"]

MODEL, OPTIM = "model/", "optim/"


def uses_sharded_checkpoint(prog, world: int) -> bool:
    """Runs on several ranks with torch's program write sharded checkpoints. One process has nothing to gather; the
    mixed-* replicas keep their fp32 masters beside the model (the .pt); DeepSpeed writes its own partitions."""
    return world > 1 and prog.engine is None and prog.master is None


def _optimizers(prog) -> list[torch.optim.Optimizer]:
    """The optimizer whose states this rank holds: torch's ZeRO-1 steps its partition with a local optimizer."""
    local = getattr(prog.optimizer, "optim", None)
    return [local if isinstance(local, torch.optim.Optimizer) else prog.optimizer]


def _param_names(prog) -> dict[int, str]:
    """id(parameter) -> the whole model's name (pipeline stages: their blocks renumbered, a tied head the embedding)."""
    if prog.layout.stage_params is not None:
        return prog.layout.stage_params
    return {id(p): n for n, p in prog.raw.named_parameters()}


class _State:
    """This rank's states under the common keys, holding the very tensors the model and optimizer use (DCP loads in
    place). Python numbers in an optimizer's state (bitsandbytes' step) travel as 0-d tensors and are put back."""

    def __init__(self, prog):
        keys = prog.layout.stage_keys
        self.flat: dict[str, torch.Tensor] = {
            MODEL + (keys[k] if keys else k): v for k, v in prog.raw.state_dict().items()
        }
        self.numbers: list[tuple[dict, str, str]] = []
        names = _param_names(prog)
        for optimizer in _optimizers(prog):
            for param, states in optimizer.state.items():
                for key, value in states.items():
                    flat_key = f"{OPTIM}{names[id(param)]}/{key}"
                    if torch.is_tensor(value):
                        self.flat[flat_key] = value
                    elif isinstance(value, (int, float)):
                        self.flat[flat_key] = torch.tensor(value)
                        self.numbers.append((states, key, flat_key))

    def put_numbers_back(self) -> None:
        for states, key, flat_key in self.numbers:
            states[key] = type(states[key])(self.flat[flat_key].item())


def _init_states(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's states (zeros) so that DCP has tensors to load into: one step at lr 0 on zero
    gradients, which leaves every parameter as it was (the loaded states then replace the zeros)."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    for param in params:
        param.grad = None


class _KeptStream:
    """A file DCP writes through, keeping the OS's error: torch.save reports a failed write (a full disk) as
    `RuntimeError: ... unexpected pos`, which names neither the cause nor the fix."""

    def __init__(self, stream, errors: list):
        self._stream, self._errors = stream, errors

    def write(self, data) -> int:
        try:
            return self._stream.write(data)
        except OSError as err:
            self._errors.append(err)
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _keeping_errors(writer) -> list[OSError]:
    """Make `writer` (DCP's FileSystemWriter) keep the OSErrors of its writes; returns the list they go to."""
    errors: list[OSError] = []
    create_stream = writer.fs.create_stream

    @contextmanager
    def kept(path, mode):
        with create_stream(path, mode) as stream:
            yield _KeptStream(stream, errors) if "w" in mode else stream

    writer.fs.create_stream = kept
    return errors


def _write_error(kept: list[OSError]) -> OSError | None:
    """DCP raises one CheckpointException on every rank when any rank's write failed: the OSError that caused it (a
    full disk), the same on every rank, or None when no write failed (a fault, to be raised as it is)."""
    import torch.distributed as dist

    mine = (kept[0].errno, kept[0].strerror or str(kept[0])) if kept else None
    found = [mine]
    if dist.is_initialized():
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, mine)
    first = next((f for f in found if f is not None), None)
    return kept[0] if kept else OSError(*first) if first else None


def save_sharded(prog, folder: Path, step: int, rank: int) -> dict | None:
    """Write this rank's shards of `step` (every rank calls it); on rank 0 the record for the step's .pt:
    {"dir": folder name, "files": {file name: sha256}}."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    final = folder / f"step_{step:08d}.dcp"
    tmp = final.with_name(final.name + ".tmp")
    writer = dcp.FileSystemWriter(tmp)
    kept = _keeping_errors(writer)
    try:
        dcp.save(_State(prog).flat, storage_writer=writer)
    except CheckpointException:
        error = _write_error(kept)
        if error is None:
            raise
        raise error from None
    if rank != 0:
        return None
    files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir())}
    shutil.rmtree(final, ignore_errors=True)  # (the same step written again by a resumed run)
    os.replace(tmp, final)
    return {"dir": final.name, "files": files}


def sharded_problem(folder: Path, record: dict, rank: int = 0, world: int = 1) -> str | None:
    """Why the sharded part of a checkpoint cannot be trusted (a missing folder or file, a checksum that differs),
    or None. With `world` ranks calling it together each reads its share of the files (rank, rank + world, ...) and
    all return the first problem any found: the same verdict on every rank, every file read once."""
    mine = None
    for name in sorted(record["files"])[rank::world]:
        path = folder / record["dir"] / name
        if not path.is_file():
            mine = f"{record['dir']}/{name} is missing"
        elif file_sha256(path) != record["files"][name]:
            mine = f"{record['dir']}/{name}: checksum mismatch, the file is damaged"
        if mine:
            break
    if world == 1:
        return mine
    import torch.distributed as dist

    found = [None] * world
    dist.all_gather_object(found, mine)
    return next((problem for problem in found if problem), None)


def load_sharded(prog, where: Path) -> None:
    """Load a sharded checkpoint into this rank's model and optimizer, re-cut for this layout (every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    for optimizer in _optimizers(prog):
        _init_states(optimizer)
    state = _State(prog)
    dcp.load(state.flat, checkpoint_id=where)
    state.put_numbers_back()
