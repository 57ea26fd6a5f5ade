"""How a rank's program holds its model and optimizer: what a checkpoint needs to know to gather it into one
layout-free form and cut it back (toolkit.checkpoint.state)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    sharded: bool = False
    """Parameters are DTensors (FSDP2 or tensor parallelism)."""
    zero1: bool = False
    """The optimizer is torch's ZeroRedundancyOptimizer."""
    stage_keys: dict | None = field(default=None, compare=False)
    """Pipeline: {this rank's state-dict key: the whole model's} (toolkit.program.pipeline.stage_state_keys)."""
    stage_params: dict | None = field(default=None, compare=False)
    """Pipeline: {id(parameter): the whole model's parameter name}; a tied head is the embedding's name."""
