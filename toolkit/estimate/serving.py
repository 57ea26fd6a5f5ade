"""`estimate(job)` for `workload: inference`: the serving figures of a resolved job as the CLI's JSON contract.

    toolkit estimate --workload inference --model llama2-7b --gpus 1xA100-80GB --concurrency 32 \\
        --input-tokens 1024 --output-tokens 256 --offer p4d.24xlarge --json

`serving` holds the KV cache (bytes per token, what the requests hold, the pool the engine reserves, its blocks),
the largest concurrency that fits, time to first token, time per output token, output tokens/s and requests/s at
the requested concurrency, and the throughput-latency curve; `memory` the device's parts; `cost` the price per
million output and input tokens on the offer. Figures not modelled are None, never zero.
"""

from __future__ import annotations

import dataclasses

from ..specs.catalog import Catalog
from ..specs.job import Job
from ..specs.params import count_params
from .band import serving_range
from .serving_load import serving_load
from .serving_memory import ServingMemory, matrix_bits, serving_memory
from .serving_time import ServingClock, serving_hardware

__all__ = ["serving_estimate", "serving_cost", "serving_point", "prices_by_offer", "load_curve"]

LOAD_CURVE_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.6)
"""Arrival rates of a load curve, as shares of the largest steady throughput the KV cache allows (its requests/s)."""


def load_curve(job: Job, catalog: Catalog, requests: int = 400) -> list[dict]:
    """Latency percentiles as the Poisson arrival rate rises towards saturation, one replica: a point per rate
    ({"rate", "ttft_s", "tpot_s", "e2e_s" (each mean, p50, p90, p99), "saturated"}); [] where the device's speed or
    room is unknown."""
    mem, _point, clock = serving_point(job, catalog)
    if clock is None:
        return []
    s = job.serving
    kv_tokens = mem.kv_blocks * s.block_size
    fits = kv_tokens // (s.input_tokens + s.output_tokens)  # requests the cache holds at once (the simulation's rule)
    top = clock.steady(max(min(fits, s.max_num_seqs), 1))["requests_per_s"]
    points = []
    for share in LOAD_CURVE_SHARES:
        rated = job.replace(serving=dataclasses.replace(s, rate=share * top, requests=requests))
        load = serving_load(rated, clock, kv_tokens)
        points.append({"rate": share * top, **{k: load[k] for k in ("ttft_s", "tpot_s", "e2e_s", "saturated")}})
    return points


def serving_point(job: Job, catalog: Catalog) -> tuple[ServingMemory, dict | None, ServingClock | None]:
    """(memory, the steady state at the job's concurrency or None where the device's speed is unknown, the clock)
    of a resolved serving job."""
    accelerator = catalog.accelerator(job.cluster.accelerator)
    mem = serving_memory(job, accelerator)
    hw = serving_hardware(job, catalog)
    if hw is None or not mem.fits:  # (a job that does not fit has no speed and no price: None, not a guess)
        return mem, None, None
    clock = ServingClock(job, hw)
    return mem, clock.steady(mem.concurrency), clock


def serving_cost(job: Job, catalog: Catalog, point: dict | None, clock: ServingClock | None) -> dict:
    """Price per million output tokens (every device-second of the replicas, prefill included) and per million
    input tokens (the share of each step the prompts add), on the job's offer, on demand or spot. The devices used
    are priced at the offer's per-device share of its instance; whole instances and their idle devices are given."""
    cost = {
        "offer": job.cost.offer,
        "spot": job.cost.spot,
        "usd_per_million_output_tokens": None,
        "usd_per_million_input_tokens": None,
    }
    if not job.cost.offer:
        return cost
    offer = catalog.offer(job.cost.offer)
    devices = job.cluster.count
    instances = -(-devices // offer.count)
    price = offer.spot_per_hour_high if job.cost.spot else offer.on_demand_per_hour
    cost.update(
        offer=offer.name,
        instances=instances,
        idle_devices=instances * offer.count - devices,
        currency=offer.currency,
        price_per_hour=price,
    )
    if price is None or point is None:
        return cost
    usd_per_s = catalog.to_usd(price, offer.currency) / offer.count * devices / 3600.0
    replicas = job.parallel.dp or 1
    out_per_s = point["output_tokens_per_s"] * replicas
    s = job.serving
    c = point["concurrency"]
    decode_only = clock.step_s(min(c, s.max_batched_tokens) / job.parallel.pp, s.input_tokens + s.output_tokens / 2)
    prompt_share = max(1.0 - clock.token_s(decode_only) / point["tpot_s"], 0.0)
    in_per_s = out_per_s * s.input_tokens / s.output_tokens
    cost.update(
        usd_per_million_output_tokens=usd_per_s / out_per_s * 1e6,
        usd_per_million_input_tokens=usd_per_s * prompt_share / in_per_s * 1e6,
        usd_per_hour=usd_per_s * 3600.0,
    )
    return cost


def serving_estimate(job: Job, catalog: Catalog, notes: list[str]) -> dict:
    """The JSON contract of a resolved serving job."""
    mem, point, clock = serving_point(job, catalog)
    s, model = job.serving, job.model
    params = count_params(model)
    if serving_hardware(job, catalog) is None:
        notes.append(f"{job.cluster.accelerator}: no speed figures (peak, bandwidth or link) to time serving with")
    why = None
    if not mem.kv_blocks:
        why = (
            f"does not fit: the weights ({mem.weights_bytes / 2**30:.1f} GiB a device) and a step's activations leave "
            f"no room for a KV cache in the engine's {mem.budget_bytes / 2**30:.1f} GiB (quantize --weights, or "
            "raise --tp)"
        )
    elif not mem.fits:
        why = (
            f"does not fit: {mem.concurrency} request(s) at {s.context} tokens need "
            f"{mem.kv_cache_bytes / 2**30:.1f} GiB of KV cache a device; the engine's share holds "
            f"{mem.max_concurrency} (lower --concurrency or --max-context, quantize --weights or --kv-dtype, or "
            "raise --tp)"
        )
    if why:
        notes.insert(0, why)
    _serving_notes(job, notes)
    curve = clock.curve(mem.max_concurrency) if clock is not None else []
    load = serving_load(job, clock, mem.kv_blocks * s.block_size, mem.concurrency) if clock is not None else None
    serving = {
        "concurrency": mem.concurrency,
        "max_concurrency": mem.max_concurrency,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "max_context": s.context,
        "weights": s.weights,
        "weight_bits": matrix_bits(job),
        "kv_dtype": s.kv_dtype,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
        "kv_cache_bytes": mem.kv_cache_bytes,
        "kv_pool_bytes": mem.kv_pool_bytes,
        "kv_blocks": mem.kv_blocks,
        "block_size": s.block_size,
        "replicas": job.parallel.dp or 1,
        **_headline(point, load),
        "prefill_s": clock.prefill_s(s.input_tokens) if clock else None,
        "curve": curve,
        "steady": point,
        "load": load,
    }
    if point is not None and (job.parallel.dp or 1) > 1:
        serving["output_tokens_per_s_total"] = point["output_tokens_per_s"] * job.parallel.dp
    memory = {
        "capacity_bytes": mem.capacity_bytes,
        "budget_bytes": mem.budget_bytes,
        "weights_bytes": mem.weights_bytes,
        "kv_cache_bytes": mem.kv_cache_bytes,
        "activation_bytes": mem.activation_bytes,
        "runtime_bytes": mem.runtime_bytes,
        "device_bytes": mem.device_bytes,
        "free_bytes": mem.capacity_bytes - mem.device_bytes,
        "fits": mem.fits,
        "why_not": why,
    }
    return {
        "job": job.to_dict(),
        "workload": "inference",
        "notes": notes,
        "model": {"name": model.name, "params": params.total, "active_params": params.active},
        "serving": serving,
        "memory": memory,
        "cost": serving_cost(job, catalog, _loaded(point, load), clock),
    }


def _loaded(point: dict | None, load: dict | None) -> dict | None:
    """The steady point with the simulation's throughput and time per output token, which the price divides by."""
    if point is None or load is None:
        return point
    return point | {"output_tokens_per_s": load["output_tokens_per_s"], "tpot_s": load["tpot_s"]["mean"]}


def _headline(point: dict | None, load: dict | None) -> dict:
    """The serving figures the contract names: the load simulation's means and percentiles where the device's speed
    is known (time to first token counts the prefills queued ahead), else None."""
    if load is None:
        return {key: None for key in ("ttft_s", "tpot_s", "output_tokens_per_s", "requests_per_s", "provenance")}
    out = {"ttft_s": load["ttft_s"]["mean"], "tpot_s": load["tpot_s"]["mean"]}
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        out |= {f"{key}_{p}": load[key][p] for p in ("p50", "p90", "p99")}
    out |= {"output_tokens_per_s": load["output_tokens_per_s"], "requests_per_s": load["requests_per_s"]}
    # where published serving runs fell around such figures (toolkit.estimate.band.serving_range)
    for key in ("ttft_s", "tpot_s", "output_tokens_per_s"):
        out[f"{key}_range"] = serving_range(out[key], key)
    return out | {"provenance": "modelled"}


def prices_by_offer(job: Job, catalog: Catalog) -> list[dict]:
    """Price per million output tokens of a serving job on every offer of its accelerator, on demand and spot:
    [{"offer", "on_demand", "spot"}] (None where the offer has no such price). Each priced copy is resolved and
    costed as toolkit.estimate.report.estimate does for a serving job, here without it (report imports this module)."""
    accelerator = catalog.accelerator(job.cluster.accelerator).name
    rows = []
    for offer in catalog.offers.values():
        if catalog.accelerator(offer.accelerator).name != accelerator:
            continue
        row = {"offer": offer.name}
        for key, spot in (("on_demand", False), ("spot", True)):
            priced = job.replace(cost=dataclasses.replace(job.cost, offer=offer.name, spot=spot))
            resolved, _notes = priced.resolve(catalog)
            _memory, point, clock = serving_point(resolved, catalog)
            row[key] = serving_cost(resolved, catalog, point, clock)["usd_per_million_output_tokens"]
        rows.append(row)
    return rows


def _serving_notes(job: Job, notes: list[str]) -> None:
    s = job.serving
    if s.weights in ("int8", "int4") or (s.weights == "fp8" and s.sparsity == "none"):
        notes.append(
            f"{s.weights} weights: read at their stored size; matmuls at the 16-bit rate on dequantized tiles "
            "(weight-only kernels such as Marlin), or at the FP8 rate where the device has FP8 units (fp8)"
        )
    if s.sparsity == "2:4":
        notes.append(
            "2:4 sparsity: an upper bound: the sparse tensor cores' doubled peak and half the weight bytes "
            "(plus 2-bit indices); measured sparse kernels reach less, and accuracy is not modelled"
        )
    notes.append(
        "continuous batching with chunked prefill, steady state: every step decodes the running requests and "
        f"prefills their share of new prompts, up to {s.max_batched_tokens} tokens (the engine's host work, "
        "sampling and scheduling, is not modelled)"
    )
