"""Generation with a KV cache over the runner's GPT: prefill the prompts, then decode one token a step, each step
attending over the keys and values every earlier step left in the cache (plain or tensor-parallel model alike).

    cache = KVCache.for_model(model, batch=4, max_len=1280)
    tokens = greedy(model, prompts, new_tokens=256, cache=cache, on_token=timer)

The cache is one preallocated (batch, kv_heads, max_len, head_dim) key and value tensor per layer, as a static
cache (Hugging Face's StaticCache, gpt-fast) keeps it; under tensor parallelism each rank keeps its kv heads. The
blocks are the training model's own modules, called here with the cache's positions: greedy decoding equals a plain
forward over the whole sequence, token for token (tests/serve/test_generate.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .model import apply_rope, rope_tables

__all__ = ["KVCache", "forward_cached", "greedy", "plain_greedy"]


class KVCache:
    """Keys and values of every layer for `batch` sequences of up to `max_len` tokens."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0
        """Positions filled so far (the same for every sequence: prompts of one length per batch)."""

    @classmethod
    def for_model(cls, model: nn.Module, batch: int, max_len: int, dtype=None) -> "KVCache":
        """A cache for this rank's share of `model`'s kv heads (k's output width over the head size)."""
        attn = model.blocks[0].attn
        kv_heads = _local(attn.k.weight).shape[0] // attn.head_dim
        dtype = dtype or _local(attn.k.weight).dtype
        device = _local(attn.k.weight).device
        return cls(len(model.blocks), batch, kv_heads, max_len, attn.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _attend(attn: nn.Module, x: torch.Tensor, cache: KVCache, layer: int, cos, sin) -> torch.Tensor:
    """One attention over x's new tokens (batch, seq, hidden): their keys and values go into the cache at its length,
    and the queries attend over everything cached up to themselves."""
    batch, seq, _ = x.shape
    start = cache.length
    q = attn.q(x).view(batch, seq, -1, attn.head_dim).transpose(1, 2)
    k = attn.k(x).view(batch, seq, -1, attn.head_dim).transpose(1, 2)
    v = attn.v(x).view(batch, seq, -1, attn.head_dim).transpose(1, 2)
    if attn.rope:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    cache.keys[layer][:, :, start : start + seq] = k
    cache.values[layer][:, :, start : start + seq] = v
    keys, values = cache.keys[layer][:, :, : start + seq], cache.values[layer][:, :, : start + seq]
    grouped = q.shape[1] != keys.shape[1]  # GQA: each kv head serves heads / kv_heads query heads
    if seq == 1:  # decode: one query sees every cached position, no mask
        y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=grouped)
    elif start == 0:
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=grouped)
    else:  # a chunk after earlier ones: causal within itself, all of the earlier positions
        mask = torch.ones(seq, start + seq, dtype=torch.bool, device=x.device).tril(start)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped)
    return attn.o(y.transpose(1, 2).reshape(batch, seq, -1))


def forward_cached(model: nn.Module, tokens: torch.Tensor, cache: KVCache, rope: tuple | None = None) -> torch.Tensor:
    """Logits of the last position of `tokens` (batch, seq), the next tokens after the cache's; fills the cache.
    `rope`: cos and sin tables covering the cache's length (the model's own cover its seq_len)."""
    seq, start = tokens.shape[1], cache.length
    x = model.tok(tokens)
    if model.pos is not None:
        x = x + model.pos(torch.arange(start, start + seq, device=tokens.device))
    cos, sin = rope if rope is not None else (model.cos, model.sin)
    if cos is not None:
        cos, sin = cos[start : start + seq], sin[start : start + seq]
    for i, block in enumerate(model.blocks):
        x = x + _attend(block.attn, block.norm1(x), cache, i, cos, sin)
        x = x + block.mlp(block.norm2(x))
    cache.length = start + seq
    logits = model.head(model.norm(x[:, -1:]))
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


def rope_for(model: nn.Module, max_len: int):
    """cos and sin for positions up to max_len (None for learned positions)."""
    if model.cos is None:
        return None
    cos, sin = rope_tables(max_len, model.spec.head_dim_, model.spec.rope_theta)
    return cos.to(model.cos.dtype), sin.to(model.sin.dtype)


@torch.inference_mode()
def greedy(
    model: nn.Module,
    prompts: torch.Tensor,
    new_tokens: int,
    cache: KVCache,
    on_token: Callable[[int], None] | None = None,
    prefill_chunk: int | None = None,
) -> torch.Tensor:
    """Greedy continuation of `prompts` (batch, input) by `new_tokens`: prefill (in chunks of `prefill_chunk` tokens
    if given), then one decode step per token. `on_token(i)` is called after the i-th new token (timing)."""
    rope = rope_for(model, cache.keys[0].shape[2])
    chunk = prefill_chunk or prompts.shape[1]
    for begin in range(0, prompts.shape[1], chunk):
        logits = forward_cached(model, prompts[:, begin : begin + chunk], cache, rope)
    out = [logits[:, -1].argmax(-1, keepdim=True)]
    if on_token:
        on_token(0)
    for i in range(1, new_tokens):
        logits = forward_cached(model, out[-1], cache, rope)
        out.append(logits[:, -1].argmax(-1, keepdim=True))
        if on_token:
            on_token(i)
    return torch.cat(out, dim=1)


@torch.inference_mode()
def plain_greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The same continuation with no cache: the whole sequence through the model's own forward for every token."""
    seq = prompts
    for _ in range(new_tokens):
        logits = model(seq)
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompts.shape[1] :]
