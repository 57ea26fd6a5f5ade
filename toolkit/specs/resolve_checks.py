"""The checks a job's values pass before it is resolved: sizes positive and fractions in range, Megatron's recompute
modules named right, and a fine-tune's adapters where the runner and the model can put them (one line each)."""

from __future__ import annotations

from typing import Any

from .errors import SpecError
from .fields import check_positive, check_range
from .model import LORA_TARGETS, nf4_shapes_ok
from .rules import adapters_fit

Job = Any  # (toolkit.specs.job imports this package's resolve: the type is named, not imported)

__all__ = ["check_sizes", "check_finetune"]


def check_sizes(job: Job) -> None:
    """Sizes that must be positive, and fractions in their ranges."""
    for section, names in (
        ("parallel", ("dp", "tp", "pp", "vpp", "cp")),
        ("batch", ("micro_batch", "global_batch")),
        ("cluster", ("count", "gpus_per_node", "intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s")),
    ):
        for name in names:
            check_positive(getattr(getattr(job, section), name), f"{section}.{name}")
    check_positive(job.tokens, "tokens")
    check_range(job.mfu, "mfu", 0.0, 1.0, low_open=True)
    check_range(job.memory.headroom_fraction, "memory.headroom_fraction", 0.0, 1.0, high_open=True)
    check_range(job.optimizer.momentum, "optimizer.momentum", 0.0, 1.0, high_open=True)
    check_range(job.cost.interruptions_per_month, "cost.interruptions_per_month", 0.0, 1.0, high_open=True)
    check_positive(job.cost.checkpoint_write_bytes_per_s, "cost.checkpoint_write_bytes_per_s")
    check_positive(job.cost.restart_s, "cost.restart_s", allow_zero=True)
    check_range(job.cost.pue, "cost.pue", 1.0, 3.0)
    check_positive(job.cost.energy_price_per_kwh, "cost.energy_price_per_kwh", allow_zero=True)
    check_positive(job.cost.grid_kg_co2_per_kwh, "cost.grid_kg_co2_per_kwh", allow_zero=True)
    _check_recompute_modules(job.memory)


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""Megatron-Core's --recompute-modules names (toolkit.estimate.activations prices each)."""


def _check_recompute_modules(memory) -> None:
    """Megatron's module list is a refinement of selective recompute: known names, and recompute selective."""
    modules = memory.recompute_modules
    if modules is None:
        return
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown or not modules:
        raise SpecError("memory.recompute_modules", list(modules), f"allowed: {', '.join(RECOMPUTE_MODULES)}")
    if memory.recompute != "selective":
        raise SpecError(
            "memory.recompute_modules",
            list(modules),
            f"refines selective recompute (Megatron's --recompute-granularity selective); memory.recompute is "
            f"{memory.recompute!r}: set it to selective",
        )


def check_finetune(job: Job, mode: str) -> None:
    """LoRA's rank, alpha and targets; QLoRA's shapes, precision and optimizer."""
    ft, model, par = job.finetune, job.model, job.parallel
    if ft.adapters:
        check_positive(ft.rank, "finetune.rank")
        check_positive(ft.alpha, "finetune.alpha")
        if not ft.targets:
            raise SpecError("finetune.targets", [], f"name at least one projection among {', '.join(LORA_TARGETS)}")
        for target in ft.targets:
            if target not in LORA_TARGETS or (target == "gate" and model.mlp != "swiglu"):
                allowed = [t for t in LORA_TARGETS if t != "gate" or model.mlp == "swiglu"]
                raise SpecError("finetune.targets", target, f"allowed: {', '.join(allowed)}")
        if not model.has_shape:
            raise SpecError("finetune.method", ft.method, "adapters need the model's shape (layers, hidden, heads)")
        if not adapters_fit(par.tp, par.pp, par.zero):
            raise SpecError(
                "finetune.method",
                ft.method,
                "LoRA is modelled for data-parallel replicas (zero 0 or 1) so far; use tp 1, pp 1",
            )
    if ft.method == "qlora":
        bad = nf4_shapes_ok(model)  # NF4 packs blocks of 64 weights, 256 scales per fp32 scale
        if bad:
            raise SpecError(
                "finetune.method",
                "qlora",
                f"NF4 stores matrices in multiples of 16,384 weights; the "
                f"{bad} projection is not (use widths that are multiples of 128)",
            )
        if mode == "fp32" or job.optimizer.name == "adamw-8bit":
            raise SpecError(
                "finetune.method",
                "qlora",
                "QLoRA computes in 16 bits with 16/32-bit adapters: use "
                "amp-bf16, pure-bf16 or mixed-bf16 (and adamw, adam or sgd)",
            )
