"""A readable GPT, sized by a ModelSpec: Llama style (RMSNorm, SwiGLU, RoPE, GQA) or GPT-2 style
(LayerNorm, GELU, learned positions). The runner trains it; the tracer measures it.

    model = GPT(ModelSpec(layers=4, hidden=256, heads=4, vocab=1024, seq_len=128))
    loss = model(tokens, targets)
    logits = model(tokens, cache=cache)       # serving: the next tokens after a KV cache (toolkit.program.generate)

This forward is the only one: the runner, the tracer, the pipeline stages (a GPT holding some of its parts,
toolkit.program.parallel.PipelineStage) and `toolkit generate` all run it; layouts are applied from outside
(toolkit.program.parallelize), as torchtitan does.

Memory-relevant choices are switches, so that estimate and trace describe the same program:
`attention` ("flash" calls SDPA and stores no score matrix; "eager" writes the scores,
softmax and dropout out as explicit ops) and `recompute` ("full" checkpoints each block,
"selective" only the attention core, "selective-op" each block keeping every other matmul's output and the
fused attention's, as torchtitan's per-op selective checkpointing does).
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..specs.model import ModelSpec
from .moe import MoE, attach_aux_loss

__all__ = ["GPT", "run_blocks"]


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=spec.norm_eps)
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps)


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim / 2) for rotary embeddings."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def positions(start, seq: int, device) -> torch.Tensor:
    """Positions start .. start + seq: one row, or a row each where `start` is a tensor of starts (a serving
    engine's batch of requests at different lengths)."""
    steps = torch.arange(seq, device=device)
    return start.to(device)[:, None] + steps if torch.is_tensor(start) else steps + start


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1, x2) of the last dimension; x is (batch, heads, seq, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, recompute_core: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads_, spec.head_dim_
        qkv_bias, out_bias = spec.bias in ("all", "qkv"), spec.bias == "all"
        self.q = nn.Linear(spec.hidden, self.heads * self.head_dim, bias=qkv_bias)
        self.k = nn.Linear(spec.hidden, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v = nn.Linear(spec.hidden, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o = nn.Linear(self.heads * self.head_dim, spec.hidden, bias=out_bias)
        self.rope = spec.position == "rope"
        self.dropout = spec.dropout
        self.attention = attention
        self.recompute_core = recompute_core

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ / √d + causal mask) v, with dropout on the probabilities while training."""
        p = self.dropout if self.training else 0.0
        if self.kv_heads != self.heads:  # GQA: each kv head serves heads / kv_heads query heads
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        if self.attention == "flash":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        seq = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        if p > 0:
            probs = F.dropout(probs, p=p)
        return probs @ v

    def forward(self, x: torch.Tensor, cos, sin, cache=None, layer: int = 0) -> torch.Tensor:
        """x (batch, seq, hidden); with a KV cache its new tokens' keys and values go into the cache and the queries
        attend over everything cached up to themselves (`cache.attend`)."""
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds heads / tp of them
        q = self.q(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            y = cache.attend(layer, q, k, v)
        elif self.recompute_core and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        return self.o(y.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.bias == "all"
        self.swiglu = spec.mlp == "swiglu"
        self.up = nn.Linear(spec.hidden, spec.ffn_, bias=bias)
        self.gate = nn.Linear(spec.hidden, spec.ffn_, bias=bias) if self.swiglu else None
        self.down = nn.Linear(spec.ffn_, spec.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); dropout on both branches. A Mixture of
    Experts' blocks past its first `dense_layers` take an MoE (toolkit.program.moe) as their MLP."""

    def __init__(self, spec: ModelSpec, attention: str, recompute_core: bool, index: int = 0):
        super().__init__()
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.attn = Attention(spec, attention, recompute_core)
        self.mlp = MoE(spec) if spec.experts and index >= spec.dense_layers else MLP(spec)
        self.dropout = nn.Dropout(spec.dropout)
        self.index = index
        """The block's layer in the whole model (its slot in a KV cache, on whichever pipeline stage it runs)."""

    def _attention(self, x: torch.Tensor, cos, sin, cache) -> torch.Tensor:
        """Three inputs without a cache: the sequence-parallel plan prepares exactly those. (A method, not a local:
        a local would keep the branch's output alive through the MLP.)"""
        return self.attn(x, cos, sin) if cache is None else self.attn(x, cos, sin, cache, self.index)

    def forward(self, x: torch.Tensor, cos=None, sin=None, cache=None) -> torch.Tensor:
        x = x + _dropped(self.dropout, self._attention(self.norm1(x), cos, sin, cache))
        x = x + _dropped(self.dropout, self.mlp(self.norm2(x)))
        if isinstance(self.mlp, MoE):  # its balancing loss trains through the block's own backward
            x = attach_aux_loss(x, self.mlp.aux, self.mlp.spec.balance_loss)
        return x


def _dropped(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """Dropout while training; in eval (generation, evaluation) not even its dispatch, which a decode step of a
    small model would pay per block."""
    return dropout(x) if dropout.training else x


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
_FUSED_ATTENTION = (
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
)


def _every_other_matmul():
    """torchtitan's per-op policy (its `selective_ac_option = "op"`): save the fused attention's outputs and the
    1st, 3rd, 5th ... matmul of the block (mm, or addmm with a bias), recompute everything else. A fresh count
    per call, kept apart for forward and recompute, so both pick the same matmuls."""
    counts = Counter()

    def policy(ctx, op, *args, **kwargs):
        if op in _MATMULS:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in _FUSED_ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, cos, sin, recompute: str, cache=None) -> torch.Tensor:
    """The blocks in order over x (batch, seq, hidden); under full or per-op recompute each is checkpointed while
    training. cos and sin come cut to the whole sequence's length (under sequence parallelism x holds a shard of
    it). calibrate times blocks through it too."""
    for block in blocks:
        if cache is not None:
            x = block(x, cos, sin, cache)
        elif recompute == "full" and torch.is_grad_enabled():
            x = checkpoint(block, x, cos, sin, use_reentrant=False)
        elif recompute == "selective-op" and torch.is_grad_enabled():
            x = checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=_every_other_matmul)
        else:
            x = block(x, cos, sin)
    return x


class GPT(nn.Module):
    """Decoder-only transformer. forward(tokens, targets) returns the mean cross-entropy in fp32; without targets
    the logits; with a KV cache the logits of the last position. A pipeline stage holds some of its parts: without
    the embedding it takes hidden states, without the head it returns them."""

    sequence_parallel = False
    """Set by tensor_parallel on a pipeline stage: a later stage then receives one tp rank's share of each
    sequence's tokens, while attention (and RoPE) covers all of them."""

    def __init__(
        self, spec: ModelSpec, attention: str = "flash", recompute: str = "none", dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # build weights in their training dtype (no conversion pass)
        try:
            self._build(spec, attention, recompute, dtype)
        finally:
            torch.set_default_dtype(previous)

    def _build(self, spec: ModelSpec, attention: str, recompute: str, dtype: torch.dtype) -> None:
        if not spec.has_shape or spec.encoder:
            raise ValueError("GPT builds decoder models with a shape (layers, hidden, heads)")
        if attention not in ("flash", "eager") or recompute not in ("none", "selective", "selective-op", "full"):
            raise ValueError(f"attention={attention!r}, recompute={recompute!r}")
        self.spec, self.recompute = spec, recompute
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_positions_, spec.hidden) if spec.position == "learned" else None
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec, attention, recompute == "selective", i) for i in range(spec.layers))
        self.norm = _norm(spec)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.tok.weight
        if spec.position == "rope":
            cos, sin = rope_tables(spec.seq_len, spec.head_dim_, spec.rope_theta)
            self.register_buffer("cos", cos.to(dtype), persistent=False)
            self.register_buffer("sin", sin.to(dtype), persistent=False)
        else:
            self.cos = self.sin = None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases (norms keep weight 1, bias 0)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        start = cache.length if cache is not None else 0
        seq = tokens.shape[1]
        if self.tok is None and self.sequence_parallel:  # x holds this rank's tokens; attention sees them all
            seq = self.spec.seq_len
        x = self.tok(tokens) if self.tok is not None else tokens
        if self.pos is not None and self.tok is not None:
            x = x + self.pos(positions(start, seq, tokens.device))
        if self.drop is not None and self.tok is not None and cache is None:  # (its call carries sp's re-layout)
            x = self.drop(x)
        cos, sin = self._rope(start, seq, cache)
        x = run_blocks(self.blocks, x, cos, sin, self.recompute, cache)
        if cache is not None:
            cache.length = start + seq
            x = x[:, -1:]  # an engine samples from the last position only
        if self.head is None:
            return x
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def _rope(self, start: int, seq: int, cache=None) -> tuple:
        """cos and sin for positions start .. start + seq: the cache's tables where it has them (they cover its
        length, which may pass the model's seq_len), else the model's."""
        cos, sin = cache.rope if cache is not None and cache.rope is not None else (self.cos, self.sin)
        if cos is None:
            return None, None
        if torch.is_tensor(start):  # one start a row (a server's batch): (batch, 1, seq, ·) tables
            at = positions(start, seq, cos.device)
            return cos[at].unsqueeze(1), sin[at].unsqueeze(1)
        return cos[start : start + seq], sin[start : start + seq]
