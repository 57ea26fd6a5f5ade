"""Exact parameter counts of a ModelSpec, split by where the parameters live, and what tensor parallelism leaves
on one rank. A fact of the model (specs): the estimator sizes memory from it, resolve splits pipelines by it
(toolkit.specs.partition)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import ModelSpec

__all__ = [
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
    """One transformer block: attention, MLP, its two norms."""
    layers: int
    """All blocks: per_layer × model.layers."""
    final: int
    """Final norm (embedding norm for BERT), pooler for an encoder."""
    head: int
    """Untied output projection (0 when tied)."""

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.layers + self.final + self.head

    @property
    def non_embedding(self) -> int:
        """Kaplan et al.'s N: everything but the embedding, position and output matrices."""
        return self.layers + self.final


def count_params(model: ModelSpec) -> ParamCount:
    """Count parameters layer by layer, the way `sum(p.numel() for p in model.parameters())` would."""
    if not model.has_shape:
        return ParamCount(embedding=0, positions=0, per_layer=0, layers=model.params, final=0, head=0)
    h, hd = model.hidden, model.head_dim_
    q_width, kv_width = model.heads * hd, model.kv_heads_ * hd
    ffn = model.ffn_
    norm = 2 * h if model.norm == "layernorm" else h

    attention = h * q_width + 2 * h * kv_width + q_width * h
    if model.bias in ("all", "qkv"):
        attention += q_width + 2 * kv_width
    if model.bias == "all":
        attention += h
    if model.mlp == "swiglu":
        mlp = 3 * h * ffn + (2 * ffn + h if model.bias == "all" else 0)
    else:
        mlp = 2 * h * ffn + (ffn + h if model.bias == "all" else 0)
    per_layer = attention + mlp + 2 * norm

    embedding = model.vocab * h + (2 * h if model.encoder else 0)
    positions = model.max_positions_ * h if model.position == "learned" else 0
    final = norm + (h * h + h if model.encoder else 0)
    head = 0 if model.tie_embeddings else h * model.vocab
    return ParamCount(
        embedding=embedding,
        positions=positions,
        per_layer=per_layer,
        layers=per_layer * model.layers,
        final=final,
        head=head,
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
