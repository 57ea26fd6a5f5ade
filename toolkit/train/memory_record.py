"""Each rank's measured tensor memory over its first two steps, written to OUT/memory/rank{r}.json (toolkit.runs.folder).

On CPU the instrument is torch's MemTracker over the real tensors (FSDPMemTracker under FSDP2), wrapped as
the tracer wraps it: the same instrument on the same program, so estimate, trace and run compare like with
like (not the allocator, nor the process's RSS). On a GPU it is torch.cuda's allocator statistics. The peak is
the second step's (optimizer states exist by then), as the trace measures it; later steps run untracked.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ..program.moe import moe_modules
from ..runs.folder import write_rank_memory

__all__ = ["MemoryRecorder"]

_STATES = {
    "params_bytes": ("PARAM", "BUFFER", "SHARDED_PARAM"),
    "grads_bytes": ("GRAD", "SHARDED_GRAD"),
    "optimizer_bytes": ("OPT", "OTH"),
}
"""MemTracker's categories (and FSDPMemTracker's) for the model states the estimate reports."""


class MemoryRecorder:
    """Call begin_step / micro_batch / optimizer_step / end_step from the training loop; it does the rest."""

    def __init__(
        self,
        prog,
        job,
        device: torch.device,
        rank: int,
        out: str | Path,
        first_step: int,
        last_step: int,
        stage: int = 0,
    ):
        self.prog, self.job, self.device, self.rank, self.out, self.stage = prog, job, device, rank, Path(out), stage
        self.steps = list(range(first_step, min(first_step + 2, last_step)))  # 0-based steps recorded
        self.tracker = None
        self.before_step: dict = {}
        self.host_at_step = 0
        self.current = -1

    def begin_step(self, step: int) -> None:
        self.current = step
        if step not in self.steps:
            return
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif step == self.steps[0]:
            from ..program.compat import PROBLEM

            for moe in self._moes():  # the routing's load on this rank over the recorded steps
                moe.loads.clear()
            if PROBLEM is not None:  # this torch moved MemTracker: train on, unrecorded, and say why once
                if self.rank == 0:
                    print(f"memory not recorded: torch {torch.__version__} lacks the tracer's internals ({PROBLEM})")
                self.steps = []
                return
            self.tracker = self._cpu_tracker()
            self.tracker.__enter__()
        else:
            self.tracker.reset_peak()

    def micro_batch(self, last: bool = False) -> None:  # noqa: ARG002 - the step's hook (toolkit.program.step)
        if self.tracker is not None:
            self.tracker.reset_mod_stats()  # MemTracker refuses a module called twice otherwise

    def forward_done(self) -> None:
        """Between a micro-batch's forward and backward: nothing to record in a run."""

    def backward_done(self) -> None:
        """The step's gradients, as the last backward left them (before mixed-* moves them to the masters)."""
        if self.tracker is not None and self.current == self.steps[-1]:
            from ..program.instrument import snapshot

            self.before_step = snapshot(self.tracker, "current")
            if self.tracker.host_bytes is not None:
                self.host_at_step = self.tracker.host_bytes(self.before_step)

    @contextlib.contextmanager
    def optimizer_step(self, step: int):
        if self.tracker is None or step != self.steps[-1]:
            yield
            return
        if self._deepspeed_offload():  # only the inner optimizer's step runs on the host, as the trace counts it
            inner = self.prog.optimizer.optimizer
            host_step = inner.step

            def on_host(*args, **kwargs):
                with self.tracker.optimizer_step():
                    return host_step(*args, **kwargs)

            inner.step = on_host
            try:
                yield
            finally:
                del inner.step
            return
        with self.tracker.optimizer_step():  # with offload the step runs on the host: not the device's
            yield

    def _deepspeed_offload(self) -> bool:
        return self.prog.engine is not None and self.job.parallel.offload == "optimizer"

    def end_step(self, step: int) -> None:
        if not self.steps or step != self.steps[-1]:
            return
        if self.device.type == "cuda":
            record = self._cuda_record()
        else:
            record = self._cpu_record()
        loads = [load for moe in self._moes() for load in moe.loads]
        if loads:  # a Mixture of Experts under expert parallelism: rows its experts took over an even share
            record["expert_load"] = sum(loads) / len(loads)
        write_rank_memory(self.out, dict(record, rank=self.rank, stage=self.stage, steps=[s + 1 for s in self.steps]))

    def _moes(self) -> list:
        """The rank's MoE blocks (none where no program is given: a GPU's allocator statistics alone)."""
        return moe_modules(self.prog.raw) if self.prog is not None else []

    def close(self) -> None:
        """Leave the tracker if the run stopped inside the recorded steps (its hooks must not outlive the run)."""
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            self.tracker = None

    def _cpu_tracker(self):
        from ..program.instrument import DeviceTracker, FSDPDeviceTracker, StageTracker, fsdp_host_bytes

        prog = self.prog
        if self.job.parallel.zero >= 2 and prog.layout.sharded and prog.schedule is None:  # (stages: below)
            tracker = FSDPDeviceTracker(prog.raw, prog.optimizer)
            if self.job.parallel.offload != "none":
                tracker.host_bytes = fsdp_host_bytes
            return tracker
        tracker = StageTracker() if prog.schedule is not None else DeviceTracker()
        extra = prog.master.params if prog.master else []
        optimizer = prog.optimizer  # DeepSpeed's wraps the torch optimizer that holds the fp32 partitions
        if not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer.optimizer
        tracker.track_external(prog.raw, optimizer, *extra)
        if self._deepspeed_offload():
            from ..program.instrument import offload_host_bytes

            tracker.host_bytes = lambda _snap: offload_host_bytes(prog.optimizer)
        elif prog.schedule is not None and self.job.parallel.offload != "none":  # FSDP2 stages, offloaded
            from ..program.instrument import offloaded_shard_bytes

            tracker.host_bytes = lambda _snap: offloaded_shard_bytes(prog.params, prog.optimizer)
        if prog.master and prog.master.main_grads is not None:
            tracker.track_gradients(prog.master.main_grads)
        return tracker

    def _cpu_record(self) -> dict:
        from ..program.instrument import FSDP_HOST, fsdp_host_bytes, snapshot

        after = snapshot(self.tracker, "current")
        peak = snapshot(self.tracker, "peak")
        self.tracker.__exit__(None, None, None)
        self.tracker = None
        fsdp_offload = self.job.parallel.offload != "none" and self.job.parallel.zero >= 2 and self.prog.engine is None
        staged = fsdp_offload and self.prog.schedule is not None  # (the stage tracker has no FSDP categories)
        on_host = ("PARAM", "GRAD", "OPT") if staged else FSDP_HOST if fsdp_offload else ()  # offload's host states
        states = {
            name: sum(
                (self.before_step if name == "grads_bytes" else after).get(c, 0) for c in cats if c not in on_host
            )
            for name, cats in _STATES.items()
        }
        states["host_bytes"] = self.host_at_step if staged else fsdp_host_bytes(self.before_step) if fsdp_offload else 0
        if self._deepspeed_offload():
            from ..program.instrument import offload_host_bytes

            states["host_bytes"] = offload_host_bytes(self.prog.optimizer)
        device_only = fsdp_offload or self._deepspeed_offload()
        return {
            "instrument": "MemTracker (real tensors, CPU)",
            "peak_bytes": peak.get("Device" if device_only else "Total", 0),
            "categories": peak,
            "states": states,
        }

    def _cuda_record(self) -> dict:
        """The allocator's allocated and reserved peaks, and what the device shows in use (nvidia-smi's figure:
        the CUDA context, NCCL's buffers and the reserved pool, which the allocator keeps at its peak until
        empty_cache, so the step's end shows it; every process on the device counts)."""
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        free, total = torch.cuda.mem_get_info(self.device)
        device = max(int(total - free), reserved)
        return {
            "instrument": "torch.cuda allocator",
            "peak_bytes": allocated,
            "reserved_peak_bytes": reserved,
            "device_peak_bytes": device,
            "categories": {"allocated_peak": allocated, "reserved_peak": reserved, "device_peak": device},
            "states": None,
        }
