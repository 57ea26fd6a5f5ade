"""A serving job under load: the engine's scheduler (toolkit.specs.engines) run over the requests by the simulation
(toolkit.estimate.serving_sim) on the job's step times, at a Poisson rate or a fixed concurrency; the latency
percentiles users set their targets on, and the goodput under the job's bounds.

    load = serving_load(job, clock, kv_tokens)   # {"ttft_s": {"mean", "p50", "p90", "p99"}, "tpot_s": ..., ...}
"""

from __future__ import annotations

import numpy as np

from ..specs.engines import engine_defaults
from ..specs.job import Job
from ..specs.serving import KV_BYTES
from .kv_cache import kv_bytes_per_token
from .serving_sim import Load, StepTable, arrivals, latencies, simulate
from .serving_time import ServingClock

__all__ = ["serving_load", "spec_tokens_per_step"]


def spec_tokens_per_step(drafts: int, acceptance: float) -> float:
    """Tokens a speculative decoding step makes: the accepted prefix of `drafts` draft tokens, each accepted with
    probability `acceptance` independently, plus the target's own token: (1 − a^(k+1)) / (1 − a) (Leviathan, Kalman
    and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1)."""
    if drafts == 0:
        return 1.0
    if acceptance >= 1.0:
        return drafts + 1.0
    return (1 - acceptance ** (drafts + 1)) / (1 - acceptance)


def serving_load(job: Job, clock: ServingClock, kv_tokens: float, concurrency: int | None = None) -> dict:
    """The simulation of the job's load (its rate, else `concurrency` or its own in flight) on one replica, or on
    its prefill and decode workers where disaggregated."""
    s = job.serving
    engine = engine_defaults(s.engine)
    table = _table(job, clock)
    tps = spec_tokens_per_step(s.spec_tokens, s.acceptance)
    rate = s.rate / (job.parallel.dp or 1) if s.rate else None  # replicas share the arrivals
    in_flight = concurrency or (s.concurrency if s.concurrency != "max" else s.max_num_seqs)
    shape = {"requests": s.requests, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
             "lengths": s.lengths, "range_ratio": s.range_ratio}  # fmt: skip
    cached = round(s.input_tokens * s.prefix_cache_hit)
    limits = {"max_num_seqs": s.max_num_seqs, "max_batched_tokens": s.max_batched_tokens, "kv_tokens": kv_tokens,
              "mixed": engine.mixed_batches}  # fmt: skip
    if s.prefill_workers:
        sim = _disaggregated(job, table, arrivals(**shape, rate=s.rate, cached_tokens=cached, tokens_per_step=tps),
                             limits, clock)  # fmt: skip
    else:
        load = arrivals(**shape, rate=rate, concurrency=None if rate else in_flight, cached_tokens=cached,
                        tokens_per_step=tps)  # fmt: skip
        sim = simulate(table, load, **limits)
    per = sim.pop("per_request")
    keeps_up = sim.pop("keeps_up", True)
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
        "host_s_per_step": table.host_s,
        "prefix_cache_hit": s.prefix_cache_hit,
        "lengths": s.lengths,
        "spec_tokens_per_step": tps,
        "disaggregated": {"prefill_workers": s.prefill_workers, "decode_workers": s.decode_workers}
        if s.prefill_workers
        else None,
        **sim,
        "goodput_fraction": float(good.mean()),
        "goodput_requests_per_s": float(good.mean()) * sim["requests_per_s"],
        "saturated": bool(rate) and not keeps_up,
    }


def _table(job: Job, clock: ServingClock) -> StepTable:
    """The job's step times, with its engine's host time (a GPU's serving engine), or the toolkit server's measured
    loop and streaming on a CPU (toolkit.calibrate.serve_host); speculative decoding's verify rows and drafting."""
    s, a = job.serving, clock.a
    gpu = clock.prof is not None  # a GPU with measured kernels runs a serving engine; a CPU runs the toolkit's own
    engine_host_s = engine_defaults(s.engine).host_s_per_step if gpu else a.serve_host_s_per_step or 0.0
    host_s = s.host_s_per_step if s.host_s_per_step is not None else engine_host_s
    host = {} if gpu else {
        "host_s_per_token": a.serve_host_s_per_token or 0.0,
        "host_s_per_request": a.serve_host_s_per_request or 0.0,
    }  # fmt: skip
    spec = {"rows_per_decode": s.spec_tokens + 1, "draft_share": s.spec_tokens * s.draft_cost} if s.spec_tokens else {}
    rows = s.max_batched_tokens + s.max_num_seqs * (s.spec_tokens + 1)
    return StepTable.of(clock, rows, host_s=host_s, fused=gpu, **host, **spec)


def _disaggregated(job: Job, table: StepTable, load: Load, limits: dict, clock: ServingClock) -> dict:
    """Prefill workers make each request's first token (its arrivals dealt round-robin), its KV cache moves to a
    decode worker (kv_transfer_s), which makes the rest; latencies per request put back together."""
    s, n = job.serving, len(load.input_tokens)
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    for w in range(s.prefill_workers):
        ids = np.arange(w, n, s.prefill_workers)
        part = Load(load.input_tokens[ids], np.ones(len(ids), dtype=np.int64), load.arrival_s[ids],
                    cached_tokens=load.cached_tokens[ids])  # fmt: skip
        first[ids] = load.arrival_s[ids] + simulate(table, part, **limits)["per_request"]["ttft_s"]
    done[:] = first
    moved = first + kv_transfer_s(job, clock)
    longer = np.flatnonzero(load.output_tokens > 1)
    order = longer[np.argsort(moved[longer], kind="stable")]
    for w in range(s.decode_workers):
        ids = order[w :: s.decode_workers]
        part = Load(load.input_tokens[ids], load.output_tokens[ids], moved[ids],
                    tokens_per_step=load.tokens_per_step, prefilled=True)  # fmt: skip
        done[ids] = moved[ids] + simulate(table, part, **limits)["per_request"]["e2e_s"]
    return latencies(load.arrival_s, first, done, load.output_tokens)


def kv_transfer_s(job: Job, clock: ServingClock) -> float:
    """Moving one request's prompt keys and values from a prefill replica to a decode one: each of the tp × pp
    devices sends its share at once, over NVLink where both replicas fit in a node, else over the network."""
    s, par = job.serving, job.parallel
    devices = par.tp * par.pp
    size = s.input_tokens * kv_bytes_per_token(job.model, KV_BYTES[s.kv_dtype]) / devices
    inside = 2 * devices <= clock.hw.gpus_per_node
    bw = clock.hw.intra_bw_bytes_per_s if inside else clock.hw.inter_bw_bytes_per_s
    return size / (bw * (clock.a.link_efficiency if inside else clock.a.network_efficiency)) + clock.a.latency_inter_s
