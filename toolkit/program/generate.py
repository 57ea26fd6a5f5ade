"""Generation with a KV cache over the runner's GPT: prefill the prompts, then decode one token a step, each step
attending over the keys and values every earlier step left in the cache (plain or tensor-parallel model alike).

    cache = KVCache.for_model(model, batch=4, max_len=1280)
    tokens = greedy(model, prompts, new_tokens=256, cache=cache, on_token=timer)

The cache is one preallocated (batch, kv_heads, max_len, head_dim) key and value tensor per layer, as a static
cache (Hugging Face's StaticCache, gpt-fast) keeps it; under tensor parallelism each rank keeps its kv heads. Each
step is the training model's own forward with the cache passed in (toolkit.program.model.GPT): greedy decoding
equals a plain forward over the whole sequence, token for token (tests/serve/test_generate.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .model import rope_tables

__all__ = ["KVCache", "next_logits", "greedy", "plain_greedy"]


class KVCache:
    """Keys and values of every layer for `batch` sequences of up to `max_len` tokens, and the rotary tables that
    cover them (the model's own cover only its seq_len)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device, rope=None):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.rope = rope
        """(cos, sin) for positions up to max_len, or None (learned positions)."""
        self.length = 0
        """Positions filled so far (the same for every sequence: prompts of one length per batch)."""

    @classmethod
    def for_model(cls, model: nn.Module, batch: int, max_len: int, dtype=None) -> KVCache:
        """A cache for this rank's share of `model`'s kv heads (k's output width over the head size)."""
        attn = model.blocks[0].attn
        kv_heads = _local(attn.k.weight).shape[0] // attn.head_dim
        dtype = dtype or _local(attn.k.weight).dtype
        device = _local(attn.k.weight).device
        rope = _rope_tables(model, max_len)
        return cls(len(model.blocks), batch, kv_heads, max_len, attn.head_dim, dtype, device, rope)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The new tokens' keys and values (batch, kv_heads, seq, head_dim) go into `layer`'s cache at its length;
        the queries attend over everything cached up to themselves. Returns (batch, heads, seq, head_dim)."""
        seq, start = q.shape[2], self.length
        self.keys[layer][:, :, start : start + seq] = k
        self.values[layer][:, :, start : start + seq] = v
        keys, values = self.keys[layer][:, :, : start + seq], self.values[layer][:, :, : start + seq]
        grouped = q.shape[1] != keys.shape[1]  # GQA: each kv head serves heads / kv_heads query heads
        if seq == 1:  # decode: one query sees every cached position, no mask
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=grouped)
        if start == 0:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=grouped)
        # a chunk after earlier ones: causal within itself, all of the earlier positions
        mask = torch.ones(seq, start + seq, dtype=torch.bool, device=q.device).tril(start)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _rope_tables(model: nn.Module, max_len: int):
    """cos and sin for positions up to max_len in the model's table dtype (None for learned positions)."""
    if model.cos is None:
        return None
    cos, sin = rope_tables(max_len, model.spec.head_dim_, model.spec.rope_theta)
    return cos.to(model.cos.dtype), sin.to(model.sin.dtype)


def next_logits(model: nn.Module, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The model's logits for the position after `tokens` (batch, seq), filling the cache: its one forward, the
    vocabulary gathered where tensor parallelism splits it."""
    logits = model(tokens, cache=cache)
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


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
    chunk = prefill_chunk or prompts.shape[1]
    for begin in range(0, prompts.shape[1], chunk):
        logits = next_logits(model, prompts[:, begin : begin + chunk], cache)
    out = [logits[:, -1].argmax(-1, keepdim=True)]
    if on_token:
        on_token(0)
    for i in range(1, new_tokens):
        logits = next_logits(model, out[-1], cache)
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
