"""DeepSpeed's checkpoints: each rank writes its partitions into `checkpoints/step_NNNNNNNN.ds/`, and the runner's
checksummed `step_NNNNNNNN.pt`, written after every rank finished, is the record that the directory is complete."""

from __future__ import annotations

from pathlib import Path

from ..specs.errors import SpecError

__all__ = ["checkpoint_tag", "save_engine", "load_engine"]


def checkpoint_tag(step: int) -> str:
    """The directory DeepSpeed writes for the checkpoint of `step`, beside the runner's step_NNNNNNNN.pt."""
    return f"step_{step:08d}.ds"


def save_engine(engine, folder: Path, step: int) -> str:
    """Every rank writes its partitions (collective); returns the tag the runner's record names."""
    tag = checkpoint_tag(step)
    engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
    return tag


def load_engine(engine, folder: Path, tag: str, saved_ranks: int, ranks: int) -> None:
    """Load this rank's partitions. DeepSpeed's partitions are laid out for the number of ranks that wrote them;
    resuming on another number needs its universal checkpoint (ds_to_universal), which the runner does not
    convert yet: refused with the way out."""
    if saved_ranks != ranks:
        raise SpecError(
            "parallel.dp",
            ranks,
            f"the DeepSpeed checkpoint {tag} was written by {saved_ranks} ranks and "
            f"its ZeRO partitions load on {saved_ranks} only; resume with --nproc "
            f"{saved_ranks} (or convert it with DeepSpeed's ds_to_universal)",
        )
    if not (folder / tag).is_dir():
        raise SpecError(
            "checkpoint",
            tag,
            f"{folder / tag} is missing (the record names it): restore the folder, or "
            "delete the record to resume from an earlier checkpoint",
        )
    engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False)
