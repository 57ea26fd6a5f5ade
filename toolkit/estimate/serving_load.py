"""A serving job under load: the engine's scheduler (toolkit.specs.engines) run over the requests by the simulation
(toolkit.estimate.serving_sim) on the job's step times, at a Poisson rate or a fixed concurrency; the latency
percentiles users set their targets on, and the goodput under the job's bounds.

    load = serving_load(job, clock, kv_tokens)   # {"ttft_s": {"mean", "p50", "p90", "p99"}, "tpot_s": ..., ...}
"""

from __future__ import annotations

import numpy as np

from ..specs.engines import engine_defaults
from ..specs.job import Job
from .serving_sim import StepTable, arrivals, simulate
from .serving_time import ServingClock

__all__ = ["serving_load"]


def serving_load(job: Job, clock: ServingClock, kv_tokens: float, concurrency: int | None = None) -> dict:
    """The simulation of the job's load (its rate, else `concurrency` or its own in flight) on one replica."""
    s = job.serving
    engine = engine_defaults(s.engine)
    gpu = clock.prof is not None  # a GPU with measured kernels runs a serving engine; a CPU runs the toolkit's own
    host_s = s.host_s_per_step if s.host_s_per_step is not None else (engine.host_s_per_step if gpu else 0.0)
    table = StepTable.of(clock, s.max_batched_tokens + s.max_num_seqs, host_s=host_s, fused=gpu)
    rate = s.rate / (job.parallel.dp or 1) if s.rate else None  # replicas share the arrivals
    in_flight = concurrency or (s.concurrency if s.concurrency != "max" else s.max_num_seqs)
    load = arrivals(
        requests=s.requests,
        input_tokens=s.input_tokens,
        output_tokens=s.output_tokens,
        rate=rate,
        concurrency=None if rate else in_flight,
    )
    sim = simulate(
        table, load, max_num_seqs=s.max_num_seqs, max_batched_tokens=s.max_batched_tokens, kv_tokens=kv_tokens
    )
    per = sim.pop("per_request")
    good = np.ones(s.requests, dtype=bool)
    if s.max_ttft_s is not None:
        good &= per["ttft_s"] <= s.max_ttft_s
    if s.max_tpot_s is not None:
        good &= per["tpot_s"] <= s.max_tpot_s
    return {
        "mode": "rate" if rate else "concurrency",
        "rate": s.rate,
        "concurrency": None if rate else in_flight,
        "engine": engine.name,
        "max_num_seqs": s.max_num_seqs,
        "max_batched_tokens": s.max_batched_tokens,
        "host_s_per_step": host_s,
        **sim,
        "goodput_fraction": float(good.mean()),
        "goodput_requests_per_s": float(good.mean()) * sim["requests_per_s"],
        "saturated": bool(rate and sim["requests_per_s"] < 0.95 * rate),
    }
