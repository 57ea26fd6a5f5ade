"""DeepSeek's multi-head latent attention (MLA) as the estimate sees it: its own projections, and an attention core of
standard shape for the rest of the model.

    job = attention_view(job)        # MLA -> heads of width (qk + v) / 2, as many key-value heads as query heads
    projection_params(model)         # the attention's matrices, for its FLOPs

Queries and keys are head_dim + rope_head_dim wide, values v_head_dim; a flash kernel keeps q, k, v and its
output, which a standard attention of (qk + v) / 2 per head with no grouping keeps too. The low-rank projections
(q through q_lora_rank, k and v through the kv_lora_rank latent and the shared rotary key) are priced by their own
matrices. The runner has no latent attention, so none of this is traced: it is modelled only (the estimate's notes
say so).
"""

from __future__ import annotations

import dataclasses

from ..specs.model import ModelSpec

__all__ = ["is_mla", "attention_view", "standard_view", "projection_params", "projection_shapes"]


def is_mla(model: ModelSpec) -> bool:
    return bool(model.has_shape and model.attention_kind == "mla")


def attention_view(job):
    """The job with a latent attention replaced by the standard one whose core keeps as much (see above)."""
    if not is_mla(job.model):
        return job
    return dataclasses.replace(job, model=standard_view(job.model))


def standard_view(m: ModelSpec) -> ModelSpec:
    """A latent attention's model as a standard one: heads of width (qk + v) / 2, no key-value grouping."""
    if not is_mla(m):
        return m
    width = (m.head_dim_ + m.rope_head_dim + m.v_head_dim_) // 2
    return dataclasses.replace(m, attention_kind="standard", head_dim=width, kv_heads=m.heads)


def projection_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of each matrix of a block's attention."""
    h, heads = model.hidden, model.heads
    if not is_mla(model):
        q, kv = heads * model.head_dim_, model.kv_heads_ * model.head_dim_
        return [(h, q), (h, kv), (h, kv), (q, h)]
    qk, r = model.head_dim_ + model.rope_head_dim, model.kv_lora_rank
    query = (
        [(h, heads * qk)] if model.q_lora_rank is None else [(h, model.q_lora_rank), (model.q_lora_rank, heads * qk)]
    )
    latent = [(h, r + model.rope_head_dim), (r, heads * (model.head_dim_ + model.v_head_dim_))]
    return query + latent + [(heads * model.v_head_dim_, h)]


def projection_params(model: ModelSpec) -> int:
    return sum(i * o for i, o in projection_shapes(model))
