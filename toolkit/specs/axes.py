"""The registry of layout axes: every way a job can be laid out over its devices, in one place (in the spirit of
torchtitan's ParallelDims). The grid, the search, the CLI, the planner panel, the text report, the proxy, the
device groups and the runner's device mesh read it; tests/specs/test_axes.py fails when a front end lacks an axis.

    for axis in AXES: axis.name, axis.field, axis.flag, axis.search, axis.choices, axis.text(value)
    data_parallel(devices, parallel)      # the dp rule: devices / (tp · pp · cp), on arrays too

Adding an axis is one entry here plus its physics (memory, time) and its program (the runner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Axis", "AXES", "AXIS", "MESH_ORDER", "model_parallel", "data_parallel", "mesh_dims"]


@dataclass(frozen=True)
class Axis:
    name: str
    """The Job field (and the key in a plan's layout)."""
    section: str
    """The Job section holding it: parallel, batch or memory."""
    label: str
    """What the planner panel and the docs call it."""
    search: tuple
    """Values the planner tries, before the model and the cluster filter them (toolkit.plan.search)."""
    choices: tuple
    """Values the planner panel offers (a slider: its least and greatest)."""
    default: object
    """The value a job has when it does not set the axis."""
    text: Callable[[object], str | None]
    """The axis in a layout's one-line report, or None where the report leaves it out (at its default)."""
    splits_devices: bool = False
    """A dimension of the device mesh other than dp: the device count is dp times the product of these."""
    control: str = "dropdown"
    """The planner panel's control for it: dropdown, toggle, slider or checkbox."""
    proxy_max: object = None
    """A proxy run on this machine (toolkit.runs.proxy) keeps the axis up to this value; None keeps the job's. (cp: the
    runner has no context parallelism, so a proxy runs without it and says so.)"""

    @property
    def field(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _shown_above(floor, form: str):
    return lambda v: form.format(v) if v > floor else None


AXES = (
    Axis(
        "tp",
        "parallel",
        "tensor parallel",
        (1, 2, 4, 8),
        (1, 2, 4, 8, 16, 32),
        1,
        "tp {}".format,
        splits_devices=True,
        proxy_max=2,
    ),
    Axis(
        "pp",
        "parallel",
        "pipeline stages",
        (1, 2, 4, 8, 16),
        (1, 2, 4, 8, 16, 32, 64),
        1,
        "pp {}".format,
        splits_devices=True,
        proxy_max=2,
    ),
    Axis("vpp", "parallel", "virtual stages", (1, 2), (1, 2, 4), 1, _shown_above(1, "vpp {}"), proxy_max=2),
    Axis(
        "cp",
        "parallel",
        "ctx parallel",
        (1, 2, 4, 8, 16),
        (1, 2, 4, 8, 16),
        1,
        _shown_above(1, "cp {}"),
        splits_devices=True,
        proxy_max=1,
    ),
    Axis(
        "sp",
        "parallel",
        "sequence parallel",
        (False, True),
        (False, True),
        False,
        lambda v: "sp" if v else None,
        control="checkbox",
    ),
    # expert parallelism splits dp, not the devices: ep ranks share out the experts of dp's replicas
    Axis(
        "ep",
        "parallel",
        "expert parallel",
        (1, 2, 4, 8, 16, 32, 64),
        (1, 2, 4, 8, 16, 32, 64),
        1,
        _shown_above(1, "ep {}"),
        proxy_max=2,
    ),
    # expert tensor parallelism: with ep, the experts' own grid etp × ep × edp over a stage's tp × cp × dp ranks
    # (Megatron-Core's MoE parallel folding); the runner has none, so a proxy runs without it and says so
    Axis(
        "etp",
        "parallel",
        "expert tp",
        (1, 2),  # (wider etp splits thin experts thinner: practitioners fold ep instead; the panel offers more)
        (1, 2, 4, 8),
        1,
        _shown_above(1, "etp {}"),
        proxy_max=1,
    ),
    Axis("zero", "parallel", "ZeRO", (0, 1, 2, 3), (0, 1, 2, 3), 0, "ZeRO-{}".format, control="toggle"),
    # HSDP as torchtitan runs it: the search tries one copy per node besides 1 (toolkit.plan.search)
    Axis(
        "dp_replicate",
        "parallel",
        "HSDP copies",
        (1,),
        (1, 2, 4, 8, 16, 32, 64),
        1,
        _shown_above(1, "HSDP ({} copies)"),
        proxy_max=2,
    ),
    Axis(
        "offload",
        "parallel",
        "offload",
        ("none", "optimizer", "params"),
        ("none", "optimizer", "params"),
        "none",
        lambda v: None if v == "none" else f"offload {v}",
    ),
    Axis(
        "micro_batch", "batch", "micro-batch", (1, 2, 4, 8), (1, 64), 1, "mb {}".format, control="slider", proxy_max=4
    ),
    Axis(
        "recompute",
        "memory",
        "recompute",
        ("none", "selective", "selective-op", "full"),
        ("none", "selective", "selective-op", "full"),
        "none",
        lambda v: None if v == "none" else f"{v} recompute",
    ),
)
AXIS = {axis.name: axis for axis in AXES}

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "dp", "edp", "ep", "cp", "tp")
"""The device mesh's dimensions, outermost first (torchtitan's order): tensor-parallel ranks are neighbours
(one node), pipeline stages far apart; under HSDP dp is split into copies (dp_replicate) outside their shard
groups (dp_shard). toolkit.estimate.comm places groups on nodes in this order, and the runner and the tracer build
their meshes by it (mesh_dims). Expert parallelism splits dp into the experts' data-parallel group (edp, outer)
and ep (inner: an expert group is neighbouring replicas, inside a node where it fits)."""


def model_parallel(parallel):
    """tp · pp · cp: the devices one data-parallel replica spans (arrays allowed)."""
    size = 1
    for axis in AXES:
        if axis.splits_devices:
            size = size * getattr(parallel, axis.name)
    return size


def data_parallel(devices, parallel):
    """The dp rule: the replicas that `devices` hold, at least one (arrays allowed)."""
    return np.maximum(devices // model_parallel(parallel), 1)


def mesh_dims(sizes: dict[str, int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) of a device mesh over the dimensions given, in MESH_ORDER."""
    names = tuple(n for n in MESH_ORDER if n in sizes)
    return names, tuple(sizes[n] for n in names)
