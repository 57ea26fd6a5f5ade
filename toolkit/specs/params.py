"""Exact parameter counts of a ModelSpec, split by where the parameters live, and what tensor parallelism leaves
on one rank. A fact of the model (specs): the estimator sizes memory from it, resolve splits pipelines by it
(toolkit.specs.partition)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import ModelSpec

__all__ = [
    "attention_params",
    "moe_params",
    "ParamCount",
    "count_params",
    "linear_params_per_layer",
    "projection_shapes",
    "replicated_per_layer",
    "vocab_per_rank",
]


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    """Token embedding (plus token types for an encoder)."""
    positions: int
    """Learned position table (0 with rotary embeddings)."""
    per_layer: int
    """One transformer block: attention, MLP (or its experts and router), its norms. A Mixture of Experts whose
    first blocks are dense (DeepSeek) counts its expert blocks here; `layers` holds the exact sum."""
    layers: int
    """All blocks."""
    final: int
    """Final norm (embedding norm for BERT), pooler for an encoder."""
    head: int
    """Untied output projection (0 when tied)."""
    experts_per_layer: int = 0
    """A Mixture-of-Experts block's routed experts: what expert parallelism shards (0 for a dense model)."""
    active_layers: int | None = None
    """What one token's pass through every block uses: its top-k experts, not all of them; None = `layers`."""

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.layers + self.final + self.head

    @property
    def active(self) -> int:
        """Parameters one token uses (a Mixture of Experts: its routed experts only), embedding included."""
        layers = self.layers if self.active_layers is None else self.active_layers
        return self.embedding + self.positions + layers + self.final + self.head

    @property
    def non_embedding(self) -> int:
        """Kaplan et al.'s N: everything but the embedding, position and output matrices."""
        return self.layers + self.final


def attention_params(model: ModelSpec) -> int:
    """One block's attention: projections, their biases, q/k norms and sinks; or DeepSeek's latent attention."""
    h, hd = model.hidden, model.head_dim_
    if model.attention_kind == "mla":
        qk = hd + model.rope_head_dim
        q = (
            h * model.heads * qk
            if model.q_lora_rank is None
            else (h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * model.heads * qk)
        )
        r = model.kv_lora_rank
        return (
            q
            + h * (r + model.rope_head_dim)
            + r
            + r * model.heads * (hd + model.v_head_dim_)
            + model.heads * model.v_head_dim_ * h
        )
    q_width, kv_width = model.heads * hd, model.kv_heads_ * hd
    attention = h * q_width + 2 * h * kv_width + q_width * h
    if model.bias in ("all", "qkv"):
        attention += q_width + 2 * kv_width
    if model.bias == "all":
        attention += h
    attention += {"none": 0, "head": 2 * hd, "full": q_width + kv_width}[model.qk_norm]
    return attention + (model.heads if model.attention_sinks else 0)


def mlp_params(model: ModelSpec, width: int, bias: bool) -> int:
    h = model.hidden
    if model.mlp == "swiglu":
        return 3 * h * width + (2 * width + h if bias else 0)
    return 2 * h * width + (width + h if bias else 0)


def moe_params(model: ModelSpec) -> tuple[int, int, int]:
    """(one MoE block's MLP part, its routed experts, what one token uses of it): router, routed and shared
    experts."""
    h = model.hidden
    one = mlp_params(model, model.expert_ffn_, model.expert_bias)
    router = model.experts * h + (model.experts if model.router_bias else 0)
    shared = model.shared_experts * mlp_params(model, model.shared_expert_ffn_, False) + (
        h if model.shared_expert_gate else 0
    )
    routed = model.experts * one
    return router + shared + routed, routed, router + shared + model.experts_per_token * one


def count_params(model: ModelSpec) -> ParamCount:
    """Count parameters layer by layer, the way `sum(p.numel() for p in model.parameters())` would."""
    if not model.has_shape:
        return ParamCount(embedding=0, positions=0, per_layer=0, layers=model.params, final=0, head=0)
    h = model.hidden
    norm = 2 * h if model.norm == "layernorm" else h
    attention = attention_params(model) + 2 * norm
    dense = attention + mlp_params(model, model.ffn_, model.bias == "all")
    embedding = model.vocab * h + (2 * h if model.encoder else 0)
    positions = model.max_positions_ * h if model.position == "learned" else 0
    final = norm + (h * h + h if model.encoder else 0)
    head = 0 if model.tie_embeddings else h * model.vocab
    if not model.experts:
        return ParamCount(
            embedding=embedding,
            positions=positions,
            per_layer=dense,
            layers=dense * model.layers,
            final=final,
            head=head,
        )
    mlp, routed, used = moe_params(model)
    moe_layers = model.layers - model.dense_layers
    return ParamCount(
        embedding=embedding,
        positions=positions,
        per_layer=attention + mlp,
        layers=model.dense_layers * dense + moe_layers * (attention + mlp),
        final=final,
        head=head,
        experts_per_layer=routed,
        active_layers=model.dense_layers * dense + moe_layers * (attention + used),
    )


def projection_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of a block, named as in toolkit.program.model."""
    h, q, kv, f = model.hidden, model.heads * model.head_dim_, model.kv_heads_ * model.head_dim_, model.ffn_
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "up": (h, f), "gate": (h, f), "down": (f, h)}


def linear_params_per_layer(model: ModelSpec) -> int:
    """Weights of a block's linear layers (no biases): what Float8 training casts to float8."""
    shapes = projection_shapes(model)
    names = ("q", "k", "v", "o", "up", "down") + (("gate",) if model.mlp == "swiglu" else ())
    return sum(shapes[n][0] * shapes[n][1] for n in names)


def vocab_per_rank(model: ModelSpec, tp=1):
    """Vocabulary rows on the busiest tensor-parallel rank: torch shards an uneven vocabulary by ceil(V / tp)."""
    return np.ceil(model.vocab / np.asarray(tp))


def replicated_per_layer(model: ModelSpec) -> int:
    """Parameters of one block that tensor parallelism does not split: the norms and the biases added after
    the row-parallel o and down projections."""
    norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
    return 2 * norm + (2 * model.hidden if model.bias == "all" else 0)
