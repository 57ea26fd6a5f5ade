"""The layout one run has at run time (torchtitan's ParallelDims): the degrees of a resolved Job, the facts derived
from them, and the device mesh's shape. The program, the tracer's fake mesh, the launchers, the launcher panel,
calibrate and the planner read these facts here instead of deriving them again.

    dims = ParallelDims.from_job(job)            # a resolved job (dp set)
    dims = ParallelDims.for_world(job, nproc)    # the dp rule: dp = ranks / (tp · pp · cp), checked
    dims.sharded, dims.fsdp, dims.ddp, dims.hand_reduce, dims.world_size
    names, sizes, flattened = dims.mesh_shape()  # toolkit.program.mesh.build_mesh builds it (torch)

Adding an axis is its registry entry (toolkit.specs.axes), its facts here, its physics (toolkit.estimate) and its
program (toolkit.program); docs/architecture.md walks through it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .axes import AXES, MESH_ORDER
from .errors import SpecError

__all__ = ["ParallelDims", "reset_layout", "experts_folded"]


def experts_folded(parallel, megatron=False):
    """The experts have a grid of their own (Megatron-Core's MoE parallel folding): they split each expert (etp),
    or ep does not divide dp's shard group, or Megatron's program runs them (which always folds). Arrays over a
    layout grid allowed; ParallelDims, the capability rules and the estimate's expert grid all ask this."""
    ep, etp = np.asarray(parallel.ep), np.asarray(parallel.etp)
    shard = np.asarray(1 if parallel.dp is None else parallel.dp) // np.asarray(parallel.dp_replicate)
    return (etp > 1) | np.asarray(megatron) | ((ep > 1) & (shard % ep != 0))


@dataclass(frozen=True)
class ParallelDims:
    dp: int = 1
    """Data-parallel replicas (under HSDP copies × shards; under expert parallelism edp × ep)."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    """Expert parallelism: ranks of the data-parallel group that share out the routed experts."""
    dp_replicate: int = 1
    """HSDP: copies of a shard group over dp."""
    zero: int = 0
    backend: str = "torch"
    etp: int = 1
    """Expert tensor parallelism: with ep, the experts' grid etp × ep × edp over a stage's tp × cp × dp ranks."""

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep", "dp_replicate", "etp"):
            if getattr(self, name) < 1:
                raise SpecError(f"parallel.{name}", getattr(self, name), "must be 1 or more")

    @classmethod
    def from_job(cls, job) -> ParallelDims:
        """The dims of a resolved job (a job whose dp is not set yet counts one replica)."""
        par = job.parallel
        return cls(par.dp or 1, par.tp, par.pp, par.cp, par.ep, par.dp_replicate, par.zero, job.backend, par.etp)

    @classmethod
    def for_world(cls, job, world: int, flag: str = "--nproc") -> ParallelDims:
        """The dp rule for `world` ranks: dp = world / (tp · pp · cp), refused in one line where the ranks do not
        split so or the job fixes another dp."""
        if world < 1:
            raise SpecError(flag, world, "must be 1 or more")
        par = job.parallel
        split = par.tp * par.pp * par.cp
        if par.dp is not None and par.dp * split != world:
            raise SpecError(
                "parallel.dp",
                par.dp,
                f"the job asks for dp × tp × pp = {par.dp * split} ranks but {flag} = {world}; "
                "make them equal, or leave dp out",
            )
        if world % split:
            raise SpecError(flag, world, f"must be a multiple of tp × pp = {split}")
        return dataclasses.replace(cls.from_job(job), dp=world // split)

    def on_job(self, job):
        """`job` laid out on these dims: its dp fixed and its cluster of world_size devices."""
        return job.replace(
            parallel=dataclasses.replace(job.parallel, dp=self.dp),
            cluster=dataclasses.replace(job.cluster, count=self.world_size),
        )

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def dp_shard(self) -> int:
        """FSDP's shard group: dp over HSDP's copies."""
        return self.dp // self.dp_replicate

    @property
    def experts_folded(self) -> bool:
        """The experts have a grid of their own (Megatron-Core's MoE parallel folding): ep spans tensor- or
        context-parallel ranks, or splits each expert (etp), instead of sitting inside dp's shard group."""
        return bool(experts_folded(self, self.backend == "megatron"))

    @property
    def edp(self) -> int:
        """The experts' data-parallel group: ranks holding the same experts (dp / ep inside dp; tp · cp · dp /
        (ep · etp) on a folded grid)."""
        if self.experts_folded:
            return self.tp * self.cp * self.dp // (self.ep * self.etp)
        return self.dp // self.ep

    def expert_mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, sizes) of a folded expert grid's own mesh over the same ranks, outermost first: pp, then edp, ep
        and etp (etp innermost: its ranks are neighbours, then ep's, as Megatron-Core orders them)."""
        names = ("pp", "edp", "ep", "etp")
        return names, (self.pp, self.edp, self.ep, self.etp)

    @property
    def fsdp(self) -> bool:
        """ZeRO-2/3 of the torch backend: FSDP2's fully_shard (even in one process, where it offloads)."""
        return self.zero >= 2 and self.backend == "torch"

    @property
    def sharded(self) -> bool:
        """Parameters are DTensors (FSDP2, tensor or expert parallelism): their state goes through DCP's
        state-dict API."""
        return self.zero >= 2 or self.tp > 1 or self.ep > 1 or self.etp > 1

    @property
    def ddp(self) -> bool:
        """Replicas wrapped in DDP: plain parameters (no tp, no ep) below ZeRO-2 over more than one replica."""
        return self.dp > 1 and self.tp == 1 and self.ep == 1 and self.zero < 2

    @property
    def hand_reduce(self) -> bool:
        """dp × tp (or ep) below ZeRO-2: DDP (torch 2.13) refuses modules that mix DTensor and plain parameters,
        so these replicas average their gradients by hand, once a step."""
        return (self.tp > 1 or self.ep > 1) and self.zero < 2 and (self.dp > 1 or self.experts_folded)

    @property
    def needs_mesh(self) -> bool:
        """More than one rank, or FSDP2 in one process (a one-rank mesh)."""
        return self.world_size > 1 or self.fsdp

    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...], dict[str, tuple[str, ...]]]:
        """(names, sizes, flattened) of the device mesh in MESH_ORDER, outermost first: dp split into HSDP's
        copies and shards, or into the experts' data-parallel group and ep, with "dp" naming the pair together
        (`flattened`) as the data loader and the other dp users see it. pp and tp are always there (the program
        slices them by name); cp only where it splits the devices."""
        dims = {"pp": self.pp, "cp": self.cp, "tp": self.tp}
        flattened = {}
        if self.ep > 1 and not self.experts_folded:  # (a folded grid is a mesh of its own: expert_mesh_shape)
            dims.update(edp=self.edp, ep=self.ep)
            flattened["dp"] = ("edp", "ep")
        elif self.dp_replicate > 1:
            dims.update(dp_replicate=self.dp_replicate, dp_shard=self.dp_shard)
            flattened["dp"] = ("dp_replicate", "dp_shard")
        else:
            dims["dp"] = self.dp
        names = tuple(n for n in MESH_ORDER if n in dims and (n != "cp" or self.cp > 1))
        return names, tuple(dims[n] for n in names), flattened


def reset_layout(parallel):
    """Every registry axis of the parallel section at its default, dp and the stage split unset: where the planner
    starts before it tries each axis's values."""
    defaults = {axis.name: axis.default for axis in AXES if axis.section == "parallel"}
    return dataclasses.replace(parallel, dp=None, stage_layers=None, partition=None, **defaults)
