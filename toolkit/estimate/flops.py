"""Training FLOPs: the 6·N·D rule, the attention term it leaves out, and an exact matmul count.

6·N·D (Kaplan et al. 2020) counts a multiply-add per parameter per token, forward (2)
and backward (4), with N = all parameters as the GPT-3 paper counts them. Attention's
score and value products add, per token and layer, 4·s·d_attn forward and twice that
backward: 12·s·d_attn for a full (bidirectional) mask, as PaLM's 12·L·H·Q·T counts, and
half, 6·s·d_attn, for a causal mask that skips the masked half. We report the causal
figure for decoders and the full one for encoders, and say which.

`flops_per_token` counts what the runner's GPT actually multiplies (every matmul, 2·m·n·k,
as torch's FlopCounterMode does): the projections, the attention products, the MLP and the
vocabulary projection; embedding lookups, norms and element-wise ops are not FLOPs here.
Backward costs twice the forward; recompute repeats forward work, which hardware FLOPs
(HFU) count and model FLOPs (MFU, PaLM's definition) do not. The recomputed work is what
torch's non-reentrant checkpoint actually reruns (it stops early), checked with FlopCounterMode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.job import Job
from ..specs.model import ModelSpec
from .mla import attention_view, projection_params, standard_view
from .moe import active_width

__all__ = ["TrainingFlops", "training_flops", "PF_DAY_FLOPS", "TokenFlops", "flops_per_token"]

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
    """Model FLOPs to train `model` (with `params` parameters: a Mixture of Experts' active ones, what a token
    multiplies) on `tokens` tokens, no recompute."""
    flops_6nd = 6.0 * params * tokens
    if not model.has_shape:
        return TrainingFlops(flops_6nd, None, "size-only model: attention term unknown")
    view = standard_view(model)
    d_attn = view.heads * view.head_dim_
    if model.encoder:
        per_token, convention = 12.0 * model.layers * model.seq_len * d_attn, "bidirectional: 12·L·s·d_attn per token"
    else:
        per_token, convention = (
            6.0 * model.layers * model.seq_len * d_attn,
            "causal: 6·L·s·d_attn per token, half of PaLM's non-causal 12·L·s·d_attn",
        )
    return TrainingFlops(flops_6nd, per_token * tokens, convention)


@dataclass(frozen=True)
class TokenFlops:
    """Forward FLOPs per token of the whole model, split so that each cost can be priced."""

    layer_matmuls: float
    """Projections and MLP of all blocks."""
    attention: float
    """Score and value products of all blocks (by the `causal` convention asked for)."""
    head: float
    """The vocabulary projection."""
    recompute: float
    """Forward work repeated in backward by activation checkpointing (hardware FLOPs only)."""
    experts: float = 0.0
    """The part of layer_matmuls a Mixture of Experts' routed experts do (priced at their own thin shapes)."""
    frozen: bool = False
    """The weights are frozen (LoRA, QLoRA): backward computes the inputs' gradients only, no weight gradients."""

    @property
    def forward(self) -> float:
        return self.layer_matmuls + self.attention + self.head

    @property
    def model(self) -> float:
        """Forward and backward (twice the forward): what MFU divides by. With frozen weights the projections' and
        the head's backward is their input gradient only (once the forward); the attention products, which have no
        weights, still take twice theirs (the adapters' own products are a rank-r sliver, left out)."""
        if self.frozen:
            return 2 * (self.layer_matmuls + self.head) + 3 * self.attention
        return 3 * self.forward

    @property
    def hardware(self) -> float:
        """Model FLOPs plus recompute: what HFU divides by."""
        return self.model + self.recompute


def flops_per_token(job: Job, causal: bool = True) -> TokenFlops:
    """FLOPs per trained token of the runner's GPT. `causal=False` counts the full score matrix, as the
    eager program (and FlopCounterMode on it) does; `causal=True` counts the half a causal kernel computes."""
    m = job.model
    # a Mixture of Experts: its MoE blocks' MLP work is the top-k and shared experts' rows (the mean over the
    # blocks, the first dense ones included), plus the router's scores
    f = (m.dense_layers * m.ffn_ + m.moe_layers * active_width(m)) / m.layers if m.experts else m.ffn_
    attention_mats = projection_params(m)  # (latent attention: its low-rank matrices)
    m = attention_view(job).model  # (latent attention: the core as a standard one of the same size)
    h, q, kv = m.hidden, m.heads * m.head_dim_, m.kv_heads_ * m.head_dim_
    mlp_matrices = 3 if m.mlp == "swiglu" else 2
    router = 2 * h * m.experts * m.moe_layers
    layer_matmuls = 2 * (attention_mats + mlp_matrices * h * f) * m.layers + router
    full_attention = 2 * 2 * m.seq_len * q * m.layers  # q·kᵀ and probs·v over all s keys
    attention = full_attention / 2 if causal and not m.encoder else full_attention
    head = 2 * h * m.vocab
    # torch's checkpoint stops recomputing once every saved tensor is back ("early stop"), so the last
    # matmul whose output nothing saved is skipped: the down projection of a block (unless dropout follows
    # it and saves its mask), the probs·v product of an eager core (a fused SDPA kernel saves its output
    # and is rerun whole)
    mode = np.asarray(job.memory.recompute)  # an array when a grid varies it
    selective = attention / 2 if job.memory.attention == "eager" else attention
    # per-op recompute reruns the matmuls its policy did not save up to the last one backward needs (k and o;
    # SwiGLU's up; GELU's down only where dropout saves a mask of its output) and the attention core unless a
    # fused kernel saved its output
    fused = job.memory.attention == "flash"
    mlp_again = h * f if m.mlp == "swiglu" or m.dropout > 0 else 0
    per_op = 2 * (h * kv + q * h + mlp_again) * m.layers + (0 if fused else attention)
    if job.memory.recompute_modules is not None:  # Megatron's --recompute-modules: the listed parts only
        dense_again, experts_again = module_recompute_flops(job)
        selective = (selective if "core_attn" in job.memory.recompute_modules else 0.0) + dense_again + experts_again
    recompute = np.select(
        [mode == "full", mode == "selective", mode == "selective-op"],
        [layer_matmuls - (m.dropout == 0) * 2 * h * f * m.layers + attention, selective, per_op],
        0.0,
    )
    recompute = recompute.item() if recompute.ndim == 0 else recompute
    experts = 2 * mlp_matrices * h * m.experts_per_token * m.expert_ffn_ * m.moe_layers if m.experts else 0.0
    return TokenFlops(
        layer_matmuls=layer_matmuls,
        attention=attention,
        head=head,
        recompute=recompute,
        experts=experts,
        frozen=job.finetune.adapters,
    )


def module_recompute_flops(job: Job) -> tuple[float, float]:
    """FLOPs per token that Megatron's `--recompute-modules` reruns beyond the attention core, as (dense, routed
    experts): mla_up_proj the latent attention's up-projections, mlp a dense block's MLP, shared_experts theirs, moe
    the whole MoE block (router, shared and routed experts; the routed share at the experts' own shapes).
    layernorm and moe_act rerun element-wise kernels only (no matmul). Zero without a module list."""
    m, modules = job.model, set(job.memory.recompute_modules or ())
    if not modules:
        return 0.0, 0.0
    h, mats = m.hidden, 3 if m.mlp == "swiglu" else 2
    dense = 0.0
    if "mla_up_proj" in modules and m.attention_kind == "mla":
        q_up = (m.q_lora_rank or 0) * m.heads * (m.head_dim_ + m.rope_head_dim)
        dense += 2 * (q_up + m.kv_lora_rank * m.heads * (m.head_dim_ + m.v_head_dim_)) * m.layers
    if "mlp" in modules:
        dense += 2 * mats * h * m.ffn_ * (m.dense_layers if m.experts else m.layers)
    shared = 2 * mats * h * m.shared_experts * m.shared_expert_ffn_ * m.moe_layers if m.experts else 0.0
    experts = 0.0
    if "moe" in modules and m.experts:
        dense += shared + 2 * h * m.experts * m.moe_layers  # and the router's scores
        experts = 2 * mats * h * m.experts_per_token * m.expert_ffn_ * m.moe_layers
    elif "shared_experts" in modules:
        dense += shared
    return dense, experts
