"""The estimate's result in typed parts: what widgets and plots read by attribute, and what `to_dict` turns into the
CLI's JSON contract (the same keys in the same order; fields not modelled yet are None, JSON null).

    result = estimate_result(job)           # toolkit.estimate.report
    result.memory.device_peak_bytes, result.time.step_s, result.cost.amount
    result.to_dict()                        # == estimate(job), what `toolkit estimate --json` prints
    Estimate.from_dict(data)                # the JSON (or a traced estimate's dict) read back into parts
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ModelPart", "MemoryPart", "ComputePart", "TimePart", "CostPart", "Estimate", "as_estimate"]


@dataclass(frozen=True)
class ModelPart:
    name: str | None = None
    params: float | None = None
    params_non_embedding: float | None = None
    params_per_device: float | None = None
    active_params: float | None = None
    """What one token uses (a Mixture of Experts: its top-k routed experts, not all); = params for a dense model."""


@dataclass(frozen=True)
class MemoryPart:
    """Per device, on the busiest device (bytes)."""

    params_bytes: float | None = None
    grads_bytes: float | None = None
    optimizer_bytes: float | None = None
    states_bytes: float | None = None
    activations_bytes: float | None = None
    peak_bytes: float | None = None
    """The tensors at the step's peak (what torch.cuda.max_memory_allocated reports)."""
    peak_phase: str | None = None
    reserved_peak_bytes: float | None = None
    """The caching allocator's pool at the peak (max_memory_reserved)."""
    device_peak_bytes: float | None = None
    """What the device holds (nvidia-smi): the pool, the CUDA context and communication buffers."""
    device_terms: dict | None = None
    expandable_segments: bool | None = None
    program: str | None = None
    host_bytes: float | None = None
    host_bytes_per_node: float | None = None
    """Offloaded states of one node's devices in host memory (toolkit.estimate.host)."""
    host_usable_bytes_per_node: float | None = None
    """The node's RAM they may use; where its figure came from is host_memory_source."""
    host_memory_source: str | None = None
    device_bytes: float | None = None
    usable_bytes: float | None = None
    fits: bool | None = None
    provenance: str = "modelled"
    """What these figures stand on: modelled by the estimate (the traced program's and a run's measured figures are
    `toolkit trace`'s and `toolkit compare`'s)."""


@dataclass(frozen=True)
class ComputePart:
    flops_6nd: float | None = None
    attention_flops: float | None = None
    total_flops: float | None = None
    hardware_flops: float | None = None
    model_flops_per_token: float | None = None
    hardware_flops_per_token: float | None = None
    pf_days: float | None = None
    pf_days_6nd: float | None = None
    attention_convention: str | None = None


@dataclass(frozen=True)
class TimePart:
    dtype: str | None = None
    peak_flops_per_device: float | None = None
    mfu: float | None = None
    mfu_source: str | None = None
    """"given" (the job's mfu) or "step-time model"."""
    train_s: float | None = None
    train_days: float | None = None
    device_hours: float | None = None
    step_s: float | None = None
    step_s_range: list | None = None
    """[low, high] seconds: where measured steps fell around the model's on runs it never saw (estimate.band)."""
    step_s_regime: str | None = None
    """Which held-out spread step_s_range comes from: run_calibrated, kernel_profile, calibrated or assumed."""
    provenance: str | None = None
    """What the step stands on: calibrated (scaled to a measured step of this stack, or a device measured by
    toolkit calibrate), modelled (kernel measurements of the part), or assumed (the model's stated assumptions)."""
    tokens_per_s: float | None = None
    mfu_modelled: float | None = None
    hfu_modelled: float | None = None
    breakdown: dict | None = None
    gemm_efficiency: float | None = None
    overlap: dict | None = None


@dataclass(frozen=True)
class CostPart:
    offer: str | None = None
    spot: bool | None = None
    instances: int | None = None
    price_per_hour: float | None = None
    amount: float | None = None
    amount_spot_low: float | None = None
    currency: str | None = None
    amount_usd: float | None = None
    spot_run: dict | None = None
    energy: dict | None = None


@dataclass(frozen=True)
class Estimate:
    job: dict = field(default_factory=dict)
    """The resolved job, as plain data."""
    notes: list[str] = field(default_factory=list)
    model: ModelPart = field(default_factory=ModelPart)
    memory: MemoryPart = field(default_factory=MemoryPart)
    compute: ComputePart = field(default_factory=ComputePart)
    time: TimePart = field(default_factory=TimePart)
    cost: CostPart = field(default_factory=CostPart)

    def to_dict(self) -> dict:
        """The JSON contract: plain Python numbers (numpy scalars converted), parts as nested dicts."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> Estimate:
        """Parts from the JSON contract; keys a part does not know are left out, missing ones are None."""
        parts = {f.name: f.type for f in dataclasses.fields(cls)}
        kwargs = {"job": data.get("job") or {}, "notes": list(data.get("notes") or [])}
        for name, part in (
            ("model", ModelPart),
            ("memory", MemoryPart),
            ("compute", ComputePart),
            ("time", TimePart),
            ("cost", CostPart),
        ):
            known = {f.name for f in dataclasses.fields(part)}
            kwargs[name] = part(**{k: v for k, v in (data.get(name) or {}).items() if k in known})
        assert set(kwargs) == set(parts)
        return cls(**kwargs)


def as_estimate(value) -> Estimate:
    """An Estimate from an Estimate or its dict form (estimate(job), a traced estimate, JSON read back)."""
    return value if isinstance(value, Estimate) else Estimate.from_dict(value)


def _plain(value):
    """Numpy scalars and 0-d arrays (the array-capable model's results for one job) as Python numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.item()
    return value
