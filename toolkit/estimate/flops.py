"""Training FLOPs: the 6·N·D rule and the attention term it leaves out.

6·N·D (Kaplan et al. 2020) counts a multiply-add per parameter per token, forward (2)
and backward (4), with N = all parameters as the GPT-3 paper counts them. Attention's
score and value products add, per token and layer, 4·s·d_attn forward and twice that
backward: 12·s·d_attn for a full (bidirectional) mask, as PaLM's 12·L·H·Q·T counts, and
half, 6·s·d_attn, for a causal mask that skips the masked half. We report the causal
figure for decoders and the full one for encoders, and say which.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs.model import ModelSpec

__all__ = ["TrainingFlops", "training_flops", "PF_DAY_FLOPS"]

PF_DAY_FLOPS = 1e15 * 86400
"""One petaFLOP/s sustained for a day."""


@dataclass(frozen=True)
class TrainingFlops:
    flops_6nd: float
    attention_flops: float | None
    """None for a size-only model (no shape, so no attention term)."""
    convention: str

    @property
    def total_flops(self) -> float | None:
        return None if self.attention_flops is None else self.flops_6nd + self.attention_flops


def training_flops(model: ModelSpec, params: int, tokens: float) -> TrainingFlops:
    """Model FLOPs to train `model` (with `params` parameters) on `tokens` tokens, no recompute."""
    flops_6nd = 6.0 * params * tokens
    if not model.has_shape:
        return TrainingFlops(flops_6nd, None, "size-only model: attention term unknown")
    d_attn = model.heads * model.head_dim_
    if model.encoder:
        per_token, convention = 12.0 * model.layers * model.seq_len * d_attn, "bidirectional: 12·L·s·d_attn per token"
    else:
        per_token, convention = 6.0 * model.layers * model.seq_len * d_attn, \
            "causal: 6·L·s·d_attn per token, half of PaLM's non-causal 12·L·s·d_attn"
    return TrainingFlops(flops_6nd, per_token * tokens, convention)
