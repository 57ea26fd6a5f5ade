"""The experiment trackers accelerate starts (TensorBoard, wandb, trackio): where they write and what they log of
the job."""

from __future__ import annotations

import os
from pathlib import Path

from ..specs import Job

__all__ = ["tracker_setup", "tracker_config"]


def tracker_setup(trackers, out: Path) -> dict:
    """Where each tracker writes: into the run folder; returns accelerate's init_kwargs. Called before the
    Accelerator imports the trackers: trackio reads TRACKIO_DIR at import (set to OUT/trackio unless given).
    wandb without a login (no WANDB_API_KEY, no WANDB_MODE) would stop the run at an interactive prompt on
    every rank, so it logs offline there (`wandb sync` uploads later)."""
    if "trackio" in trackers:
        os.environ.setdefault("TRACKIO_DIR", str(out / "trackio"))
    kwargs = {}
    if "wandb" in trackers:
        offline = not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
        kwargs["wandb"] = {"dir": str(out), **({"mode": "offline"} if offline else {})}
    return kwargs


def tracker_config(job: Job) -> dict:
    """The job as the flat scalars trackers take (TensorBoard's hparams refuse nested dicts, lists and None):
    dotted keys, lists and None as text."""
    flat = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value if isinstance(value, (bool, int, float, str)) else str(value)

    walk("", job.to_dict())
    return flat
