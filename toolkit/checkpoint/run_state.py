"""What a checkpoint holds of a running program, and back: every rank's part gathered for rank 0 to write,
restored on resume (on the same or another number of ranks), and the ranks agreeing on a write that failed."""

from __future__ import annotations

from pathlib import Path

import torch

from ..program.build import Program
from ..specs import Job, SpecError
from .sharded import load_sharded, uses_sharded_checkpoint
from .state import gather_state, restore_state

__all__ = ["load_checkpoint", "checkpoint_state", "first_error"]


def load_checkpoint(
    job: Job, prog: Program, state: dict, scaler, pruner, rank: int, world: int, out: Path
) -> tuple[int, int]:
    """Restore a checkpoint into this rank; returns (step, skipped steps so far). A checkpoint written on another
    number of ranks loads too (states are kept by parameter name, shards re-cut by DCP): only the per-rank RNG
    starts afresh. DeepSpeed's
    checkpoints hold its own partitions and load into its engine only, on as many ranks as wrote them."""
    written_by_deepspeed = bool(state.get("deepspeed"))
    if written_by_deepspeed != (prog.engine is not None):
        wrote, runs = ("deepspeed", "torch") if written_by_deepspeed else ("torch", "deepspeed")
        raise SpecError(
            "parallel.backend",
            runs,
            f"the checkpoint was written by the {wrote} backend, whose states "
            f"the {runs} backend does not load; resume with the layout that wrote "
            "it, or start a new --out folder",
        )
    if prog.engine is not None:
        from .deepspeed import load_engine

        load_engine(prog.engine, out / "checkpoints", state["deepspeed"], len(state["rng"]), world)
    elif state.get("dcp"):
        load_sharded(prog, out / "checkpoints" / state["dcp"]["dir"])
    elif prog.master:
        prog.raw.load_state_dict(state["model"])
        prog.optimizer.load_state_dict(state["optimizer"])
        prog.master.load_state_dict(state["master"])
    else:
        restore_state(prog.raw, prog.optimizer, state["model"], state["optimizer"], prog.layout)
    scaler.load_state_dict(state["scaler"])
    if pruner and state.get("masks"):
        pruner.load_state_dict(state["masks"])
    if len(state["rng"]) == world:
        torch.set_rng_state(state["rng"][rank]["cpu"])
        if torch.cuda.is_available() and "cuda" in state["rng"][rank]:
            torch.cuda.set_rng_state(state["rng"][rank]["cuda"])
    else:
        torch.manual_seed(job.training.seed + 1 + rank + state["step"] * 7919)
    return state["step"], state["skipped_total"]


def checkpoint_state(prog: Program, device: torch.device, world: int) -> tuple[dict, dict, list]:
    """(model state, optimizer state, every rank's RNG): collectives, so every rank calls it; complete on rank 0."""
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state()
    all_rng = [rng]
    if world > 1:
        all_rng = [None] * world
        torch.distributed.all_gather_object(all_rng, rng)
    if prog.engine is not None or uses_sharded_checkpoint(prog, world):
        return None, None, all_rng  # (each rank writes its shards, or DeepSpeed its partitions: loop's save)
    if prog.master:
        return prog.raw.state_dict(), prog.optimizer.state_dict(), all_rng
    model_sd, optim_sd = gather_state(prog.raw, prog.optimizer, prog.layout)
    return model_sd, optim_sd, all_rng


def first_error(error: OSError | None, world: int) -> OSError | None:
    """The error of the lowest rank that had one, on every rank: each stops with the same line."""
    if world == 1:
        return error
    found = [None] * world
    torch.distributed.all_gather_object(found, None if error is None else (error.errno, error.strerror, str(error)))
    errno_, strerror, text = next(e for e in found if e is not None)
    return OSError(errno_, strerror or text)
