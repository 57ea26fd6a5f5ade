"""What `toolkit generate` runs: its rules over a resolved serving job (tp = the ranks it starts), one place for
the refusals the generated table shows beside the runner's and the tracers'."""

from __future__ import annotations

from ..specs.job import compute_dtype
from .rule import Rule

__all__ = ["GENERATE"]


def _compute(job) -> str:
    return compute_dtype(job.precision.mode)


GENERATE = (
    Rule(
        "generate",
        "model",
        "a model without a shape, an MoE over several ranks, or latent attention",
        lambda j: (
            not j.model.has_shape or bool(j.model.experts and j.parallel.tp > 1) or j.model.attention_kind == "mla"
        ),
        "generate runs dense models with a shape (an MoE on one rank; no MLA)",
        value=lambda j: j.model.name,
    ),
    Rule(
        "generate",
        "serving.weights",
        "weights stored in another dtype than the compute dtype",
        lambda j: j.serving.weights != _compute(j),
        lambda j: (
            f"generate keeps weights and cache in the compute dtype ({_compute(j)}); the estimate prices the others"
        ),
    ),
    Rule(
        "generate",
        "serving.kv_dtype",
        "a KV cache in another dtype than the compute dtype",
        lambda j: j.serving.kv_dtype != _compute(j),
        lambda j: (
            f"generate keeps weights and cache in the compute dtype ({_compute(j)}); the estimate prices the others"
        ),
    ),
    Rule(
        "generate",
        "serving.max_context",
        "a context beyond the learned position table",
        lambda j: j.model.position == "learned" and j.serving.context > j.model.max_positions_,
        lambda j: (
            f"is beyond the model's {j.model.max_positions_} learned positions; shorten the requests or raise --seq"
        ),
        value=lambda j: j.serving.context,
    ),
    Rule(
        "generate",
        "--nproc",
        "tensor-parallel ranks that do not divide the kv heads",
        lambda j: bool(j.model.has_shape and j.model.kv_heads_ % j.parallel.tp),
        lambda j: f"must divide the model's {j.model.kv_heads_} kv heads (the runner splits them)",
        value=lambda j: j.parallel.tp,
    ),
)
