"""The host's share of `toolkit generate --serve`: what its engine loop, queues and HTTP streaming cost a step, a
token and a request with the model taken out (a stand-in that returns at once), measured by `toolkit bench` against
that server. The serving simulation adds it to the model's step times for the toolkit's own engine, as an engine's
host time per step (toolkit.estimate.serving_load); the model's own operations are calibrated apart.

    serve_host(vocab=256)   # {"serve_host_s_per_step": ..., "serve_host_s_per_token": ..., "serve_host_s_per_request": ...}
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from ..serve.bench import run_bench
from ..serve.engine import BatchEngine
from ..serve.http import http_server

__all__ = ["serve_host"]

CONCURRENCIES = (1, 4)
"""Requests in flight at the two points whose inter-token latencies give the cost of a step and of each token."""
OUTPUT_TOKENS = 32


class _NullModel(nn.Module):
    """Logits of zeros at once: the engine's loop, queues and the server's streaming are all that runs."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens: torch.Tensor, cache=None) -> torch.Tensor:
        return torch.zeros(tokens.shape[0], 1, self.vocab)


class _NullCache:
    def __init__(self, slots: int):
        self.lengths = torch.zeros(slots, dtype=torch.long)

    def view(self, rows: list[int]):
        return self

    def commit(self, steps: int) -> None:
        return None


def serve_host(vocab: int = 256, requests: int = 24) -> dict:
    """Seconds of host work a step (at one request), a token beyond the first in a step, and a request."""
    slots = max(CONCURRENCIES)
    engine = BatchEngine(_NullModel(vocab), max_num_seqs=slots, max_batched_tokens=4096, max_len=4096,
                         cache=_NullCache(slots))  # fmt: skip
    server = http_server(engine, "null", vocab, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        itl, ttft = {}, {}
        for c in CONCURRENCIES:
            r = run_bench(url, "null", concurrency=c, input_tokens=16, output_tokens=OUTPUT_TOKENS,
                          requests=requests, vocab=vocab)  # fmt: skip
            itl[c], ttft[c] = r["itl_s"]["p50"], r["ttft_s"]["p50"]
    finally:
        server.shutdown()
        engine.stop()
    low, high = CONCURRENCIES
    per_token = max((itl[high] - itl[low]) / (high - low), 0.0)
    per_step = max(itl[low] - per_token, 0.0)
    return {
        "serve_host_s_per_step": per_step,
        "serve_host_s_per_token": per_token,
        "serve_host_s_per_request": max(ttft[low] - itl[low], 0.0),
    }
