"""The model being trained: a dense decoder (GPT/Llama style) or a BERT-style encoder."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .errors import SpecError
from .fields import check_positive, check_range

__all__ = ["ModelSpec", "default_ffn", "LORA_TARGETS"]

LORA_TARGETS = ("q", "k", "v", "o", "up", "gate", "down")
"""The block's projections a low-rank adapter may sit on (gate: SwiGLU's only)."""


def default_ffn(hidden: int, mlp: str) -> int:
    """FFN width when none is given: 4h for GELU; Llama's 2/3·4h rounded up to 256 for SwiGLU."""
    if mlp == "swiglu":
        return 256 * -(-int(2 * 4 * hidden / 3) // 256)
    return 4 * hidden


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture of the model. Either the shape (layers, hidden, heads) or only `params`."""

    name: str | None = None
    """Preset or user name, for display only."""
    layers: int | None = None
    """Transformer blocks."""
    hidden: int | None = None
    """Model width h."""
    heads: int | None = None
    """Query heads."""
    kv_heads: int | None = None
    """Key/value heads (GQA); None means as many as `heads` (multi-head attention)."""
    head_dim: int | None = None
    """Width of one head; None means hidden / heads."""
    ffn: int | None = None
    """Inner width of the MLP; None means `default_ffn(hidden, mlp)`."""
    mlp: Literal["gelu", "swiglu"] = "gelu"
    """GELU MLP (two matrices) or SwiGLU (three matrices)."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """LayerNorm has weight and bias; RMSNorm has a weight only."""
    position: Literal["learned", "rope"] = "learned"
    """Learned position table (GPT-2/3, BERT) or rotary embeddings (no parameters)."""
    bias: Literal["all", "qkv", "none"] = "all"
    """Which linear layers carry a bias: all (GPT-2/3, BERT, NeoX), q/k/v only (Qwen2), none (Llama)."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies (Llama 2: 10,000; Llama 3: 500,000); numerics only."""
    norm_eps: float = 1e-5
    """Epsilon of LayerNorm/RMSNorm; numerics only."""
    vocab: int = 50257
    """Vocabulary size (rows of the embedding)."""
    seq_len: int = 2048
    """Training sequence length in tokens."""
    max_positions: int | None = None
    """Rows of a learned position table; None means seq_len."""
    tie_embeddings: bool = True
    """Output projection shares the input embedding matrix."""
    dropout: float = 0.0
    """Dropout probability (affects saved activations, not parameters)."""
    encoder: bool = False
    """BERT-style encoder: adds token-type embeddings (2 rows) and a pooler (h·h + h)."""
    params: int | None = None
    """Parameter count for a model given by size only (no shape); shape fields must then be empty."""
    # ---- Mixture of Experts ------------------------------------------------------------
    experts: int = 0
    """Routed experts in each Mixture-of-Experts block; 0 = a dense model (every block one MLP)."""
    experts_per_token: int = 0
    """Routed experts each token goes to (top-k)."""
    shared_experts: int = 0
    """Experts every token goes to besides its routed ones (DeepSeek, Qwen2-MoE)."""
    expert_ffn: int | None = None
    """Inner width of one routed expert; None = ffn."""
    shared_expert_ffn: int | None = None
    """Inner width of one shared expert; None = expert_ffn."""
    dense_layers: int = 0
    """The first blocks keep a dense MLP of width ffn (DeepSeek's first_k_dense_replace)."""
    router: Literal["softmax", "sigmoid"] = "softmax"
    """Softmax over the experts' scores (Mixtral, Qwen, OLMoE, DeepSeek-V2), or sigmoid scores with a per-expert
    bias that balances the load without an auxiliary loss (DeepSeek-V3)."""
    router_bias: bool = False
    """The router's linear layer has a bias (gpt-oss)."""
    expert_bias: bool = False
    """Each expert's projections have biases (gpt-oss)."""
    shared_expert_gate: bool = False
    """A sigmoid gate (hidden -> 1) scales the shared expert's output (Qwen2-MoE)."""
    capacity_factor: float | None = None
    """Tokens an expert takes at most, as a multiple of an even share (the rest are dropped); None = dropless."""
    max_nodes_per_token: int | None = None
    """Node-limited routing: a token's experts lie on at most this many nodes (DeepSeek-V3: 4; HF configs'
    topk_group where n_group groups the experts by node); None = no limit."""
    expert_imbalance: float | None = None
    """The busiest expert's tokens over the mean (MaxVio + 1) that memory and step time are sized for; None = the
    sourced figure for the router (toolkit.estimate.moe: 1.52 with a balancing loss, 1.04 loss-free)."""
    balance_loss: float = 0.01
    """Weight of the load-balancing loss (Switch Transformer's, per sequence) in the training loss; 0 = none
    (DeepSeek-V3 balances with its router's bias instead). HF configs' router_aux_loss_coef."""
    # ---- attention variants --------------------------------------------------------------
    attention_kind: Literal["standard", "mla"] = "standard"
    """Multi-head (or grouped-query) attention, or DeepSeek's multi-head latent attention: q and kv through low-rank
    projections, with a decoupled rotary head (head_dim is then the non-rotary part of a query head)."""
    q_lora_rank: int | None = None
    """MLA: rank of the query's low-rank projection; None = a full query projection (DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = None
    """MLA: rank of the compressed key-value latent (what a KV cache keeps per token, with the rotary key)."""
    rope_head_dim: int | None = None
    """MLA: width of the decoupled rotary part of each query head and of the shared rotary key."""
    v_head_dim: int | None = None
    """MLA: width of a value head; None = head_dim."""
    qk_norm: Literal["none", "head", "full"] = "none"
    """RMSNorm on queries and keys: per head (Qwen3, head_dim weights each) or over the whole projection (OLMoE)."""
    attention_sinks: bool = False
    """A learned sink logit per head (gpt-oss)."""
    sliding_window: int | None = None
    """Tokens a query attends back over in the sliding-window layers (Mistral 7B v0.1: 4096 in every layer; gpt-oss:
    128 in every other layer). Serving's KV cache keeps that many per such layer; the training estimate prices full
    attention."""
    sliding_layers: int | None = None
    """How many of the layers use the window; None = all of them (where sliding_window is set)."""

    # ---- derived -------------------------------------------------------------------
    @property
    def has_shape(self) -> bool:
        return self.layers is not None

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def ffn_(self) -> int:
        return self.ffn if self.ffn is not None else default_ffn(self.hidden, self.mlp)

    @property
    def expert_ffn_(self) -> int:
        return self.expert_ffn if self.expert_ffn is not None else self.ffn_

    @property
    def shared_expert_ffn_(self) -> int:
        return self.shared_expert_ffn if self.shared_expert_ffn is not None else self.expert_ffn_

    @property
    def v_head_dim_(self) -> int:
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim_

    @property
    def moe_layers(self) -> int:
        """Blocks with experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def max_positions_(self) -> int:
        return self.max_positions if self.max_positions is not None else self.seq_len

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    # ---- checks --------------------------------------------------------------------
    def validate(self) -> None:
        """Refuse shapes no transformer can have; the message names the field and the fix."""
        for name in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "ffn",
            "vocab",
            "seq_len",
            "max_positions",
            "params",
        ):
            check_positive(getattr(self, name), f"model.{name}")
        check_range(self.dropout, "model.dropout", 0.0, 1.0, high_open=True)
        shape = ("layers", "hidden", "heads")
        given = [n for n in shape if getattr(self, n) is not None]
        if self.params is not None:
            if given:
                raise SpecError(
                    f"model.{given[0]}",
                    getattr(self, given[0]),
                    "give either model.params or the shape (layers, hidden, heads), not both",
                )
            return
        if len(given) != len(shape):
            missing = next(n for n in shape if getattr(self, n) is None)
            raise SpecError(
                f"model.{missing}",
                None,
                "is required: give layers, hidden and heads (or model.params for a size-only model)",
            )
        if self.head_dim is None and self.hidden % self.heads:
            raise SpecError(
                "model.heads", self.heads, f"must divide model.hidden = {self.hidden} (or set model.head_dim)"
            )
        if self.heads % self.kv_heads_:
            allowed = ", ".join(str(k) for k in range(1, self.heads + 1) if self.heads % k == 0)
            raise SpecError(
                "model.kv_heads", self.kv_heads_, f"must divide model.heads = {self.heads}; allowed: {allowed}"
            )
        if self.position == "learned" and self.max_positions_ < self.seq_len:
            raise SpecError(
                "model.seq_len",
                self.seq_len,
                f"exceeds the learned position table (model.max_positions = {self.max_positions_}); "
                "raise model.max_positions in a job file to train a wider table",
            )
        self._validate_moe()

    def _validate_moe(self) -> None:
        for name in ("experts", "experts_per_token", "shared_experts", "dense_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpecError(f"model.{name}", value, "must be a whole number, 0 or more")
        if self.sliding_layers is not None and not 0 <= self.sliding_layers <= self.layers:
            raise SpecError(
                "model.sliding_layers", self.sliding_layers, f"must lie between 0 and model.layers = {self.layers}"
            )
        for name in (
            "expert_ffn",
            "shared_expert_ffn",
            "q_lora_rank",
            "kv_lora_rank",
            "rope_head_dim",
            "v_head_dim",
            "sliding_window",
        ):
            check_positive(getattr(self, name), f"model.{name}")
        if self.experts:
            if not 1 <= self.experts_per_token <= self.experts:
                raise SpecError(
                    "model.experts_per_token",
                    self.experts_per_token,
                    f"each token goes to 1 to model.experts = {self.experts} experts",
                )
            if self.dense_layers >= self.layers:
                raise SpecError(
                    "model.dense_layers",
                    self.dense_layers,
                    f"must leave some of the {self.layers} blocks to the experts",
                )
            if self.expert_imbalance is not None and self.expert_imbalance < 1:
                raise SpecError(
                    "model.expert_imbalance",
                    self.expert_imbalance,
                    "the busiest expert's load over the mean is 1 or more",
                )
            if self.balance_loss < 0:
                raise SpecError("model.balance_loss", self.balance_loss, "must be 0 (none) or more")
            if self.capacity_factor is not None and self.capacity_factor <= 0:
                raise SpecError("model.capacity_factor", self.capacity_factor, "must be above 0 (or null: dropless)")
        elif self.experts_per_token or self.shared_experts or self.dense_layers:
            raise SpecError("model.experts", 0, "experts_per_token, shared_experts and dense_layers need model.experts")
        if self.attention_kind == "mla" and (self.kv_lora_rank is None or self.rope_head_dim is None):
            raise SpecError(
                "model.kv_lora_rank",
                self.kv_lora_rank,
                "latent attention (attention_kind: mla) needs kv_lora_rank and rope_head_dim",
            )


def nf4_shapes_ok(model: ModelSpec) -> str | None:
    """The first block projection whose size is not a multiple of 64 × 256 weights (NF4 with double
    quantization packs those), or None when all fit."""
    h, q, kv, f = model.hidden, model.heads * model.head_dim_, model.kv_heads_ * model.head_dim_, model.ffn_
    shapes = {"q": h * q, "k": h * kv, "v": h * kv, "o": q * h, "up": h * f, "down": f * h}
    for name, numel in shapes.items():
        if numel % (64 * 256):
            return name
    return None
