"""The memory instrument the runner and the tracer share: torch's MemTracker (FSDPMemTracker under FSDP2) kept to the
device's peak, so that a trace on fake tensors (toolkit.trace) and a run's record of its first steps
(toolkit.train.memory_record) are one program measured with one instrument.

    tracker = DeviceTracker(); tracker.track_external(model, optimizer)
    with tracker: ...; snapshot(tracker, "peak")          # bytes by category on the CPU device
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from .compat import FSDPMemTracker, MemRefType, MemTracker

__all__ = [
    "DeviceTracker",
    "StageTracker",
    "FSDPDeviceTracker",
    "FSDP_HOST",
    "fsdp_host_bytes",
    "snapshot",
    "offloaded_shard_bytes",
    "offload_host_bytes",
    "storage_bytes",
    "optimizer_states",
]


class _NoHook:
    """Stands in for a gradient hook on a frozen parameter (which cannot take one)."""

    def remove(self) -> None:
        return None


class _DevicePeak:
    """What our trackers change in MemTracker: the peak is the device's total alone, kept without per-module peaks
    (they cost O(modules) on every op: minutes at 80 layers), and can be restarted."""

    host_bytes: Callable[[dict], int] | None = None
    """Offload: how many of a snapshot's bytes are in host memory (the CPU program has one memory). The peak is
    then the device's: the total less these, outside the optimizer step (which runs on the host), recorded in the
    snapshot as "Device"."""
    _on_host = False

    def reset_peak(self) -> None:
        """Forget the peak so far: the next one is measured from here."""
        self._peak_mem.clear()
        self._peak_mem_snap.clear()

    @contextlib.contextmanager
    def optimizer_step(self):
        """Around the optimizer step: with offload it runs on the host, so nothing in it counts to the device."""
        self._on_host = self.host_bytes is not None
        try:
            yield
        finally:
            self._on_host = False

    def _update_peak_stats(self, peak_state) -> None:  # noqa: ARG002 - MemTracker's signature
        if self._on_host:
            return
        for device, snap in self._curr_mem_snap.items():
            total = snap["Total"]
            if self.host_bytes is not None:
                total -= self.host_bytes(snap)
            if self._peak_mem.get(device, 0) < total:
                self._peak_mem[device] = total
                self._peak_mem_snap[device] = dict(snap) if self.host_bytes is None else dict(snap, Device=total)


class DeviceTracker(_DevicePeak, MemTracker):
    """MemTracker with the device's peak (_DevicePeak) that accepts frozen parameters (LoRA)."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        for param in module.parameters():
            if not param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def track_gradients(self, tensor: torch.Tensor) -> None:
        """Count a tensor made outside the tracker as gradients (fp32 main gradients: the masters' .grad)."""
        self._update_and_maybe_create_winfos(tensor, MemRefType.GRAD)


class StageTracker(DeviceTracker):
    """For pipeline stages: a stage runs its forward once per micro-batch within one step, which MemTracker takes
    for a new iteration and refuses; the per-module statistics it keeps for that are not used here."""

    def _pre_fw_hook(self, module, inputs) -> None:
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            return
        super()._pre_fw_hook(module, inputs)


class FSDPDeviceTracker(_DevicePeak, FSDPMemTracker):
    """FSDPMemTracker with the device's peak (_DevicePeak)."""


FSDP_HOST = ("SHARDED_PARAM", "SHARDED_GRAD", "OPT")
"""What FSDP2's CPU offload keeps in host memory, by FSDPMemTracker's categories."""


def fsdp_host_bytes(snap: dict) -> int:
    return sum(v for k, v in snap.items() if getattr(k, "name", k) in FSDP_HOST)


def offloaded_shard_bytes(params: list, optimizer) -> int:
    """What FSDP2's CPUOffloadPolicy keeps on the host, counted from the tensors (a pipeline stage's tracker has no
    FSDP categories): each rank's shards of the parameters, of their gradients and of the optimizer's states, each
    storage once."""
    tensors = list(params) + [p.grad for p in params if p.grad is not None]
    tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t) and t.dim()]
    seen = {}
    for t in tensors:
        storage = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def snapshot(tracker, kind: str) -> dict[str, int]:
    """The tracker's "current" or "peak" bytes on the CPU device, by category name."""
    snap = tracker.get_tracker_snapshot(kind)
    device = snap.get(torch.device("cpu"), {})
    return {getattr(k, "name", str(k)): int(v) for k, v in device.items()}


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (DeepSpeed's parameters are views into flat buffers)."""
    seen = {}
    for t in tensors:
        if t is not None and t.numel():
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_states(zero) -> list:
    """The inner (torch) optimizer's state tensors: its moments over the fp32 partitions."""
    return [t for s in zero.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]


def offload_host_bytes(zero) -> int:
    """What ZeRO-Offload keeps in host memory, in bytes (DeepSpeed's optimizer `zero`): the trace's and the
    runner's memory records count it apart from the device."""
    return storage_bytes(offload_host_tensors(zero))


def offload_host_tensors(zero) -> list:
    """What ZeRO-Offload keeps in host memory: the fp32 master partition and its fp32 gradient, the optimizer
    states, and at stages 1 and 2 a 16-bit copy of the partition it sends to the device after the step, a staging
    buffer the size of the largest parameter and (accumulating) each parameter's gradient summed so far; at
    stage 3 the 16-bit gradient partition."""
    states = optimizer_states(zero)
    if hasattr(zero, "fp32_partitioned_groups_flat"):  # stage 3
        fp32 = list(zero.fp32_partitioned_groups_flat)
        return fp32 + [t.grad for t in fp32] + states + [zero.grad_partitions_flat_buffer]
    fp32 = list(zero.single_partition_of_fp32_groups)
    return (
        fp32
        + [t.grad for t in fp32]
        + states
        + list(zero.param_buffer_of_bit16_for_cpu_offload_groups)
        + [zero.temp_grad_buffer_for_cpu_offload]
        + list(zero.accumulated_grads_in_cpu.values())
    )
