"""The serving planner: the cheapest deployment (offer × weight dtype × tp × replicas) that serves a stated load
within a time-per-output-token bound, and the Pareto front of price per token against latency.

    plan_serving(job, catalog, offers=["p4de.24xlarge", "p5.48xlarge"])   # job.serving: the load and the bound

Each candidate is one replica of tp devices estimated as `toolkit estimate --workload inference` does
(toolkit.estimate.serving): it runs at the largest concurrency on its throughput-latency curve whose time per output
token meets serving.max_tpot_s (the most its KV cache holds where there is no bound); whole instances are rented,
and as many replicas run as they hold, at least enough for serving.target_tokens_per_s (or target_requests_per_s ×
output_tokens). No bound and no target: one instance's worth, ranked by price per million output tokens.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

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
    return {"weights": weights, "tp": tp, "point": best, "max_concurrency": mem.max_concurrency}


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
        "ttft_s": cand["point"]["ttft_s"],
        "tpot_s": cand["point"]["tpot_s"],
        "output_tokens_per_s": tokens,
        "requests_per_s": tokens / s.output_tokens,
        "usd_per_hour": usd_per_hour,
        "usd_per_million_output_tokens": usd_per_hour / (tokens * 3600) * 1e6,
    }


def plan_serving(job: Job, catalog: Catalog, offers: list[str], top: int = 10) -> dict:
    """{"target", "evaluated", "plans" (cheapest first), "pareto", "notes", "why_none"} for a serving job."""
    if not offers:
        raise SpecError("--offers", None, "a serving plan compares offers: give --offers A,B,...")
    s = job.serving
    plans, evaluated = [], 0
    for name in offers:
        offer = catalog.offer(name, "--offers")
        for weights in _weights_for(job, catalog, offer.accelerator):
            for tp in (t for t in TP_CHOICES if t <= offer.count):
                evaluated += 1
                cand = _candidate(job, catalog, offer, weights, tp)
                deployment = _deployment(job, catalog, offer, cand) if cand else None
                if deployment:
                    plans.append(deployment)
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
            "concurrency meeting the bound; whole instances, as many replicas as they hold"
        ],
        "why_none": []
        if plans
        else [
            "no offer, weight dtype and tp both fits the model with its KV cache and meets the bound; relax "
            "--max-tpot-s, shorten --max-context or add offers"
        ],
    }
