"""A decode step's figures, measured for a serving job's CPU estimate (toolkit.estimate.serving_time): the fixed cost
of one operation of toolkit.program.generate's decode step, and the rate its products stream their weights. Kernel
level: the job's kind of block at tiny widths, and the job's own matrices at its concurrency's rows."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from ..specs.job import Job
from .kernels import dispatched_ops, timed_s

__all__ = ["inference_op_overhead_s", "decode_bw_bytes_per_s"]


def inference_op_overhead_s(job: Job | None = None, layers: int = 4) -> float:
    """Seconds of one tensor operation's fixed cost in generation: one decode step of toolkit.program.generate over
    the job's kind of block (its norm, MLP, positions, kv grouping) at widths too small to cost anything (4 per
    head, vocabulary 16), over the operations it dispatches: the dispatch, the module calls and the Python between
    them that a decode step pays per operation. Without a shaped job: a chain of tiny operations."""
    if job is None or not job.model.has_shape or job.model.encoder:
        x = torch.ones(1)

        def chain():
            y = x
            for _ in range(200):
                y = y * 1.0001

        with torch.inference_mode():
            return timed_s(chain) / 200
    from ..program.generate import KVCache, next_logits
    from ..program.model import GPT

    m = job.model
    spec = dataclasses.replace(
        m,
        layers=layers,
        hidden=4 * m.heads,
        head_dim=None,
        ffn=None,
        vocab=16,
        seq_len=64,
        max_positions=None,
        experts=0,
        experts_per_token=0,
        shared_experts=0,
        dense_layers=0,
        attention_kind="standard",
    )
    model = GPT(spec).eval()
    cache = KVCache.for_model(model, 1, 64)
    token = torch.zeros(1, 1, dtype=torch.long)

    def step():
        next_logits(model, token, cache)
        cache.length -= 1

    with torch.inference_mode():
        next_logits(model, torch.zeros(1, 16, dtype=torch.long), cache)
        return statistics.median(timed_s(step, seconds=0.1) for _ in range(3)) / dispatched_ops(step)


def decode_bw_bytes_per_s(job: Job, dtype: torch.dtype) -> float:
    """Weight bytes per second a decode step's products stream: every block's matrices (this rank's share), each its
    own tensor as in the model (so that the caches hold what they would hold of it), times the step's rows (the
    serving job's concurrency, else one), outside autograd; their bytes over the time of one pass."""
    from ..estimate.steptime import block_matmul_shapes

    shapes = [(int(k), int(n)) for _m, k, n in block_matmul_shapes(job)]
    concurrency = job.serving.concurrency if job.workload == "inference" else 1
    rows = concurrency if isinstance(concurrency, int) else 1
    bias = job.model.bias == "all"
    layers = [
        [(torch.randn(n, k, dtype=dtype), torch.randn(n, dtype=dtype) if bias else None) for k, n in shapes]
        for _ in range(job.model.layers)
    ]
    inputs = {k: torch.randn(rows, 1, k, dtype=dtype) for k, _n in shapes}

    def run():
        for layer in layers:
            for w, b in layer:
                torch.nn.functional.linear(inputs[w.shape[1]], w, b)

    with torch.inference_mode():  # (the median of three: a shared machine's streaming rate drifts by a third)
        seconds = statistics.median(timed_s(run, seconds=0.1) for _ in range(3))
    return sum(w.numel() * w.element_size() for layer in layers for w, _b in layer) / seconds
