"""What a serving engine keeps per token of every running request: the keys and values of each layer (the KV cache).

    kv_bytes_per_token(model, kv_bytes=2, tp=1)          # one device's share, all its layers, full attention
    cache_bytes(model, tokens=4096, kv_bytes=2, tp=2)   # one sequence of 4096 tokens, sliding windows capped

Per layer and token a standard attention keeps a key and a value of kv_heads × head_dim each: multi-head attention
(kv_heads = heads), grouped-query (fewer) and multi-query (one) differ only in kv_heads. Tensor parallelism splits
the key-value heads; where there are fewer than tp of them each rank keeps a copy of one (vLLM replicates them).
DeepSeek's latent attention (MLA) keeps the compressed latent (kv_lora_rank) and the shared rotary key
(rope_head_dim) instead, one per token for all heads, on every tensor-parallel rank (vLLM's MLA backends do). A
sliding-window layer keeps at most its window. `toolkit generate` measures the runner's cache against these
(tests/serve/test_generate.py).
"""

from __future__ import annotations

import math

from ..specs.model import ModelSpec

__all__ = ["kv_width", "kv_bytes_per_token", "cache_bytes", "cached_tokens"]


def kv_width(model: ModelSpec, tp: int = 1) -> int:
    """Numbers one layer keeps per token on one tensor-parallel rank."""
    if model.attention_kind == "mla":
        return model.kv_lora_rank + model.rope_head_dim
    kv_heads = max(math.ceil(model.kv_heads_ / tp), 1)
    return 2 * kv_heads * model.head_dim_


def _layers(model: ModelSpec, pp: int) -> tuple[int, int]:
    """(full-attention layers, sliding-window layers) on the busiest pipeline stage."""
    per_stage = math.ceil(model.layers / pp)
    if not model.sliding_window:
        return per_stage, 0
    sliding = model.sliding_layers if model.sliding_layers is not None else model.layers
    sliding_here = math.ceil(sliding / pp)
    return per_stage - min(sliding_here, per_stage), min(sliding_here, per_stage)


def kv_bytes_per_token(model: ModelSpec, kv_bytes: float, tp: int = 1, pp: int = 1) -> float:
    """Bytes one token adds to one device's cache while every layer still keeps it (within any window)."""
    full, sliding = _layers(model, pp)
    return (full + sliding) * kv_width(model, tp) * kv_bytes


def cached_tokens(model: ModelSpec, tokens: int, pp: int = 1, block_size: int = 1) -> float:
    """Token-layers a sequence of `tokens` keeps, over the layers of the busiest stage, in units of one layer: full
    layers keep every token, sliding ones their window. In blocks of `block_size` tokens (a paged engine's), each
    layer's count rounds up to whole blocks, and a window that does not start on a block's edge spans one more."""
    full, sliding = _layers(model, pp)
    blocks = math.ceil(tokens / block_size)
    window = model.sliding_window or tokens
    window_blocks = min(blocks, math.ceil(window / block_size) + (block_size > 1))
    return (
        (full * blocks + sliding * window_blocks) * block_size
        if block_size > 1
        else full * tokens + sliding * min(tokens, window)
    )


def cache_bytes(model: ModelSpec, tokens: int, kv_bytes: float, tp: int = 1, pp: int = 1, block_size: int = 1):
    """One device's KV-cache bytes for one sequence of `tokens` tokens (in whole blocks of `block_size`)."""
    return cached_tokens(model, tokens, pp, block_size) * kv_width(model, tp) * kv_bytes
