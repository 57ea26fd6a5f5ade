"""The serving planner: the cheapest deployment (offer × weight dtype × tp × replicas) that serves a stated load
within a time-per-output-token bound, and the Pareto front of price per token against latency.

    plan_serving(job, catalog, offers=["p4de.24xlarge", "p5.48xlarge"])   # job.serving: the load and the bound

Each candidate is one replica of tp devices estimated as `toolkit estimate --workload inference` does
(toolkit.estimate.serving): it runs at the largest concurrency on its throughput-latency curve whose time per output
token meets serving.max_tpot_s (the most its KV cache holds where there is no bound); whole instances are rented,
and as many replicas run as they hold, at least enough for serving.target_tokens_per_s (or target_requests_per_s ×
output_tokens). No bound and no target: one instance's worth, ranked by price per million output tokens. With a
target each deployment is then simulated at its replicas' share of it (toolkit.estimate.serving_load): one that
falls behind or misses a bound under that load is dropped, and its p99 latencies are reported.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..estimate.serving_load import serving_load
from ..estimate.serving_memory import serving_memory
from ..estimate.serving_time import ServingClock, serving_hardware
from ..specs import Job, SpecError
from ..specs.catalog import Catalog
from .search import pareto_front

__all__ = ["plan_serving", "WEIGHT_CHOICES", "TP_CHOICES"]

WEIGHT_CHOICES = ("bf16", "fp8", "int8", "int4")
TP_CHOICES = (1, 2, 4, 8)


def _weights_for(job: Job, catalog: Catalog, accelerator: str) -> list[str]:
    if job.serving.weights is not None:
        return [job.serving.weights]
    fp8 = catalog.accelerator(accelerator).peak_flops("fp8") is not None
    return [w for w in WEIGHT_CHOICES if w != "fp8" or fp8]


def _candidate(job: Job, catalog: Catalog, offer, weights: str, tp: int) -> dict | None:
    """One replica on `tp` devices of the offer at the best concurrency for the bound; None where it does not fit."""
    s = job.serving
    trial = job.replace(
        cluster=dataclasses.replace(job.cluster, accelerator=offer.accelerator, count=tp),
        parallel=dataclasses.replace(job.parallel, tp=tp, pp=1, dp=1),
        serving=dataclasses.replace(s, weights=weights, concurrency="max"),
        cost=dataclasses.replace(job.cost, offer=None),
    )
    try:
        trial, _notes = trial.resolve(catalog)
    except SpecError:
        return None
    mem = serving_memory(trial, catalog.accelerator(offer.accelerator))
    hw = serving_hardware(trial, catalog)
    if mem.max_concurrency < 1 or hw is None:
        return None
    curve = ServingClock(trial, hw).curve(mem.max_concurrency)
    meeting = [
        p
        for p in curve
        if (s.max_tpot_s is None or p["tpot_s"] <= s.max_tpot_s)
        and (s.max_ttft_s is None or p["ttft_s"] <= s.max_ttft_s)
    ]
    if not meeting:
        return None
    best = max(meeting, key=lambda p: p["output_tokens_per_s"])
    kv_tokens = mem.kv_blocks * trial.serving.block_size
    return {"weights": weights, "tp": tp, "point": best, "max_concurrency": mem.max_concurrency, "job": trial,
            "kv_tokens": kv_tokens, "hw": hw}  # fmt: skip


SIMULATED_REQUESTS = 300
"""Requests each deployment's load simulation runs (about 20-40 ms a replica)."""


PREFILL_SHARES = (1 / 4, 1 / 3, 1 / 2, 2 / 3)
"""Shares of a deployment's replicas tried as prefill workers when it is split disaggregated (the rest decode)."""


def simulated(cand: dict, replicas: int, requests_per_s: float, prefill_workers: int = 0) -> dict:
    """The deployment under Poisson arrivals at the target (toolkit.estimate.serving_load): aggregated, one
    replica's share of it; disaggregated, the whole of it over `prefill_workers` and the remaining decode workers.
    The latencies the steady formula cannot give (queueing, percentiles) and whether it keeps up."""
    job = cand["job"]
    split = (
        {"prefill_workers": prefill_workers, "decode_workers": replicas - prefill_workers} if prefill_workers else {}
    )
    rate = requests_per_s if prefill_workers else requests_per_s / replicas
    rated = job.replace(serving=dataclasses.replace(job.serving, rate=rate, requests=SIMULATED_REQUESTS, **split))
    load = serving_load(rated, ServingClock(rated, cand["hw"]), cand["kv_tokens"])
    return {
        "rate_per_replica": requests_per_s / replicas,
        **split,
        "ttft_s": load["ttft_s"]["mean"],
        "ttft_s_p99": load["ttft_s"]["p99"],
        "tpot_s": load["tpot_s"]["mean"],
        "tpot_s_p99": load["tpot_s"]["p99"],
        "saturated": load["saturated"],
    }


def meets_bounds(sim: dict, serving) -> bool:
    """The simulated replica keeps up and its mean latencies meet the job's bounds."""
    return (
        not sim["saturated"]
        and (serving.max_tpot_s is None or sim["tpot_s"] <= serving.max_tpot_s)
        and (serving.max_ttft_s is None or sim["ttft_s"] <= serving.max_ttft_s)
    )


def _deployment(job: Job, catalog: Catalog, offer, cand: dict) -> dict | None:
    """Whole instances holding enough replicas for the target; None where the offer has no price."""
    s = job.serving
    price = offer.spot_per_hour_high if job.cost.spot else offer.on_demand_per_hour
    if price is None or cand["tp"] > offer.count:
        return None
    per_replica = cand["point"]["output_tokens_per_s"]
    target = s.target_tokens_per_s or (s.target_requests_per_s or 0) * s.output_tokens
    needed = max(math.ceil(target / per_replica), 1) if target else 1
    per_instance = offer.count // cand["tp"]
    instances = math.ceil(needed / per_instance)
    replicas = instances * per_instance
    usd_per_hour = catalog.to_usd(price * instances, offer.currency)
    tokens = replicas * per_replica
    rate = s.target_requests_per_s or (target / s.output_tokens if target else None)
    sim = simulated(cand, replicas, rate) if rate else None
    return {
        "offer": offer.name,
        "accelerator": offer.accelerator,
        "weights": cand["weights"],
        "tp": cand["tp"],
        "replicas": replicas,
        "devices": replicas * cand["tp"],
        "instances": instances,
        "concurrency": cand["point"]["concurrency"],
        "max_concurrency": cand["max_concurrency"],
        "ttft_s": sim["ttft_s"] if sim else cand["point"]["ttft_s"],  # the load's means where simulated
        "tpot_s": sim["tpot_s"] if sim else cand["point"]["tpot_s"],
        "output_tokens_per_s": tokens,
        "requests_per_s": tokens / s.output_tokens,
        "usd_per_hour": usd_per_hour,
        "usd_per_million_output_tokens": usd_per_hour / (tokens * 3600) * 1e6,
        "simulated": sim,
        "disaggregated": None,
    }


def _disaggregated(job: Job, cand: dict, deployment: dict) -> dict | None:
    """The same instances split into prefill and decode workers (PREFILL_SHARES), the split with the lowest p99
    time to first token among those that keep up and meet the bounds; None where none does or one replica only."""
    replicas, rate = deployment["replicas"], deployment["simulated"]["rate_per_replica"] * deployment["replicas"]
    splits = sorted({min(max(round(replicas * share), 1), replicas - 1) for share in PREFILL_SHARES})
    tried = [simulated(cand, replicas, rate, p) for p in splits if replicas >= 2]
    good = [sim for sim in tried if meets_bounds(sim, job.serving)]
    if not good:
        return None
    best = min(good, key=lambda sim: sim["ttft_s_p99"])
    return deployment | {"simulated": best, "ttft_s": best["ttft_s"], "tpot_s": best["tpot_s"],
                         "disaggregated": {k: best[k] for k in ("prefill_workers", "decode_workers")}}  # fmt: skip


def plan_serving(job: Job, catalog: Catalog, offers: list[str], top: int = 10) -> dict:
    """{"target", "evaluated", "plans" (cheapest first), "pareto", "notes", "why_none"} for a serving job."""
    if not offers:
        raise SpecError("--offers", None, "a serving plan compares offers: give --offers A,B,...")
    s = job.serving
    plans, evaluated, failed_sim = [], 0, 0
    for name in offers:
        offer = catalog.offer(name, "--offers")
        for weights in _weights_for(job, catalog, offer.accelerator):
            for tp in (t for t in TP_CHOICES if t <= offer.count):
                evaluated += 1
                cand = _candidate(job, catalog, offer, weights, tp)
                deployment = _deployment(job, catalog, offer, cand) if cand else None
                missed = bool(deployment and deployment["simulated"] and not meets_bounds(deployment["simulated"], s))
                failed_sim += missed  # the steady formula met the bound, the load over time does not
                if deployment and not missed:
                    plans.append(deployment)
                # splitting the same instances pays where a bound on the first token binds, or the aggregate failed
                tight = s.max_ttft_s is not None or missed
                split = (
                    _disaggregated(job, cand, deployment) if deployment and deployment["simulated"] and tight else None
                )
                if split:
                    plans.append(split)
    key = "usd_per_hour" if (s.target_tokens_per_s or s.target_requests_per_s) else "usd_per_million_output_tokens"
    plans.sort(key=lambda p: (p[key], p["tpot_s"]))
    front = (
        pareto_front(
            np.array([p["tpot_s"] for p in plans]), np.array([p["usd_per_million_output_tokens"] for p in plans])
        )
        if plans
        else []
    )
    target = (
        f"{s.target_tokens_per_s:g} output tokens/s"
        if s.target_tokens_per_s
        else f"{s.target_requests_per_s:g} requests/s"
        if s.target_requests_per_s
        else "the lowest price per million output tokens"
    )
    bound = f", time per output token ≤ {s.max_tpot_s * 1e3:g} ms" if s.max_tpot_s else ""
    bound += f", time to first token ≤ {s.max_ttft_s * 1e3:g} ms" if s.max_ttft_s else ""
    return {
        "target": target + bound,
        "evaluated": evaluated,
        "plans": plans[:top],
        "pareto": [plans[i] for i in front],
        "notes": [
            f"each replica: {s.input_tokens} prompt + {s.output_tokens} new tokens a request, at the largest "
            "concurrency meeting the bound; whole instances, as many replicas as they hold",
            *(
                [
                    f"each shortlisted deployment simulated at its share of the target (Poisson, {SIMULATED_REQUESTS} "
                    f"requests); {failed_sim} met the bound in the steady state but not under that load"
                ]
                if (s.target_tokens_per_s or s.target_requests_per_s)
                else []
            ),
        ],
        "why_none": []
        if plans
        else [
            "no offer, weight dtype and tp both fits the model with its KV cache and meets the bound; relax "
            "--max-tpot-s, shorten --max-context or add offers"
        ],
    }
