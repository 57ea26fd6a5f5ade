"""Search: every layout of a job on every cluster asked for, keep what fits, rank by time or cost.

    result = search(job, catalog, offers=["p5.48xlarge", "p4de.24xlarge"], objective="cost", max_gpus=512)
    result["plans"][0]           # the best plan: layout, memory, step time, days, cost
    result["pareto"]             # plans no other plan beats on both time and cost

Costs are ranked in US dollars through the catalog's dated exchange rates (offers keep their own
currency in the output); with spot prices the expected interruptions and Young/Daly checkpoints
lengthen each plan (toolkit.estimate.spot). A cluster is an accelerator and a count: the one given (`--gpus`), or for each offer whole
instances in powers of two up to `max_gpus`. On each cluster the layout grid (tp, pp, virtual
stages, sequence parallelism, ZeRO stage, offload, micro-batch, recompute) is evaluated at once by
the same numpy code `toolkit estimate` runs (toolkit.estimate.grid, memory, steptime): no second
copy of any formula. Fields the user fixed (a flag or a job-file value) are not varied.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from ..capability import runnable_mask
from ..estimate.band import band, regime_of
from ..estimate.device import device_memory
from ..estimate.grid import LayoutGrid, layout_grid
from ..estimate.hardware import Hardware, hardware_for, network_figure
from ..estimate.host import host_memory
from ..estimate.memory import memory_estimate
from ..estimate.pipeline import simulate
from ..estimate.spot import spot_run
from ..estimate.states import model_state_bytes
from ..estimate.steptime import StepTime
from ..specs import Job, SpecError
from ..specs.axes import AXES, AXIS
from ..specs.catalog import Catalog, Offer
from ..specs.dims import reset_layout
from ..specs.stages import chunk_layers, uneven_fits
from .moe_options import fastest_moe_options

__all__ = ["search", "AXIS_VALUES", "pareto_front", "plan_job"]

AXIS_VALUES = {axis.name: axis.search for axis in AXES}
"""Values tried per axis (toolkit.specs.axes; filtered by what the model and cluster allow)."""

PER_TOKENS = 1e9
"""A fine-tune without a budget (--tokens, --dataset-tokens) is planned per this many tokens."""

MIN_CP_TOKENS = 8192
"""Context parallelism is searched only where each rank keeps at least this many tokens of a sequence."""


def _clusters(catalog: Catalog, gpus: tuple[int, str] | None, offers: list[str] | None, max_gpus: int | None):
    """(accelerator name, device count, offer name or None) for every cluster to try."""
    if gpus is not None:
        count, name = gpus
        return [(catalog.accelerator(name).name, count, None)]
    out = []
    for name in offers or []:
        offer = catalog.offer(name, "--offers")
        count = offer.count
        limit = max_gpus or 4096
        while count <= limit:
            out.append((catalog.accelerator(offer.accelerator).name, count, offer.name))
            count *= 2
        if count == offer.count:  # even one instance is above the limit
            raise SpecError("--max-gpus", max_gpus, f"is below one {offer.name} instance ({offer.count} devices)")
    return out


def _axes(job: Job, devices: int, fixed: set[str]) -> dict:
    """Values to try on each axis: the job's own where fixed, else AXIS_VALUES within the model's limits."""
    m = job.model
    axes = {}
    for name, values in AXIS_VALUES.items():
        section = getattr(job, AXIS[name].section)
        if name in fixed:
            axes[name] = [getattr(section, name)]
            continue
        if name == "tp":
            values = [t for t in values if m.heads % t == 0 and m.kv_heads_ % t == 0 and devices % t == 0]
        if name == "cp":  # a ring step needs enough tokens to hide its sends: at least 8K a rank (Llama 3: 128K on 16)
            values = [
                c for c in values if m.seq_len % (2 * c) == 0 and m.seq_len // c >= MIN_CP_TOKENS and devices % c == 0
            ] or [1]
        if name == "pp":
            values = [p for p in values if uneven_fits(m.layers, p) and devices % p == 0]  # uneven stages too
        if name == "ep":  # experts share out evenly (dp dividing it is the layout rule's: layout_valid)
            values = [e for e in values if m.experts and m.experts % e == 0 and devices % e == 0] or [1]
        if name == "etp":  # an expert's matrices split evenly (the grid fitting the ranks is layout_valid's)
            values = [e for e in values if m.experts and m.expert_ffn_ % e == 0 and devices % e == 0] or [1]
        if name == "dp_replicate" and devices > job.cluster.gpus_per_node:  # HSDP as torchtitan runs it: shard
            values = [1, devices // job.cluster.gpus_per_node]  # within a node, a copy per node
        axes[name] = list(values)
    return axes


def _resolve_base(base: Job, catalog: Catalog) -> Job:
    """The search's starting job on its cluster. Its layout (all devices data-parallel) is only a start: when the
    global batch does not split over every device (128 sequences of 128K tokens on 16,384 GPUs), resolve it on as
    many devices as it does split over and put the count back; the grid keeps the layouts whose dp divides it."""
    try:
        return base.resolve(catalog)[0]
    except SpecError as err:
        batch, count = base.batch.global_batch, base.cluster.count
        if err.field != "batch.global_batch" or batch is None or math.gcd(count, batch) == count:
            raise
        fewer = dataclasses.replace(base.cluster, count=math.gcd(count, batch))
        resolved = base.replace(cluster=fewer).resolve(catalog)[0]
        return resolved.replace(
            cluster=dataclasses.replace(resolved.cluster, count=count),
            parallel=dataclasses.replace(resolved.parallel, dp=count),
        )


def pareto_front(times: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both time and cost (sorted by time)."""
    order = np.lexsort((costs, times))
    front, best = [], math.inf
    for i in order:
        if costs[i] < best:
            front.append(i)
            best = costs[i]
    return np.array(front, dtype=int)


def search(
    job: Job,
    catalog: Catalog,
    *,
    gpus: tuple[int, str] | None = None,
    offers: list[str] | None = None,
    objective: str = "time",
    max_gpus: int | None = None,
    deadline_days: float | None = None,
    top: int = 10,
    fixed: set[str] = frozenset(),
    runnable: bool = False,
) -> dict:
    """Evaluate every (cluster, layout), keep those that fit (and with `runnable`, those `toolkit train` can train:
    toolkit.capability), and return the best `top` and the Pareto front."""
    _check_request(job, gpus, offers, objective)
    evaluated, refusals, blocks, per_billion = 0, [], [], False
    for accelerator, count, offer_name in _clusters(catalog, gpus, offers, max_gpus):
        try:
            resolved = _resolve_base(_cluster_base(job, accelerator, count, offer_name), catalog)
        except SpecError as err:
            refusals.append(f"{count}x{accelerator}: {err}")
            continue
        if resolved.tokens is None and resolved.workload == "finetune":  # ranked per billion tokens
            resolved = resolved.replace(tokens=PER_TOKENS)
            per_billion = True
        elif resolved.tokens is None:
            raise SpecError("--tokens", None, "a plan needs a token budget (the preset has none published)")
        hw = hardware_for(resolved, catalog)
        if hw is None:
            refusals.append(f"{accelerator}: the catalog lacks its peak, memory bandwidth or link figure")
            continue
        grid = layout_grid(resolved, **_axes(job, count, fixed))
        evaluated += len(grid)
        grid = grid.take(np.flatnonzero(grid.valid))  # only the layouts the rules allow are priced
        block = _evaluate_cluster(grid, resolved, hw, catalog, accelerator, count, fixed)
        if runnable:
            block["ok"] &= np.broadcast_to(runnable_mask(grid.job), block["ok"].shape)
        if deadline_days is not None:
            block["ok"] &= block["train_s"] <= deadline_days * 86400
        blocks.append(block)
    plans, pareto, fitting = _rank(blocks, job, objective, top)
    return {
        "evaluated": evaluated,
        "fitting": fitting,
        "objective": objective,
        "runnable_only": runnable,
        "per_billion_tokens": per_billion,
        "plans": plans,
        "pareto": pareto,
        "refused_clusters": refusals,
    }


def _check_request(job: Job, gpus: tuple[int, str] | None, offers: list[str] | None, objective: str) -> None:
    """Refuse a search that cannot rank anything before any cluster is evaluated."""
    if objective not in ("time", "cost"):
        raise SpecError("--objective", objective, "allowed: time, cost")
    if gpus is None and not offers:
        raise SpecError("plan", None, "give the hardware: --gpus COUNTxNAME, or --offers A,B,... to compare offers")
    if objective == "cost" and not offers and not job.cost.offer:
        raise SpecError("--objective", "cost", "needs prices: give --offers (or --offer) as well")


def _cluster_base(job: Job, accelerator: str, count: int, offer_name: str | None) -> Job:
    """The job moved onto one cluster with its layout reset, so the grid varies every axis the user left free."""
    return job.replace(
        cluster=dataclasses.replace(job.cluster, accelerator=accelerator, count=count),
        parallel=reset_layout(job.parallel),  # every axis, ep included: the grid tries each
        cost=dataclasses.replace(job.cost, offer=offer_name or job.cost.offer),
    )


def _evaluate_cluster(
    grid: LayoutGrid, resolved: Job, hw: Hardware, catalog: Catalog, accelerator: str, count: int, fixed: set[str]
) -> dict:
    """Every layout of one cluster at once: what the device holds against what it can, the step time (an MoE's at its
    fastest dispatcher and overlap, unless fixed), and the run's time and cost. `ok` marks the layouts that are valid
    and fit."""
    mem = memory_estimate(grid.job)
    acc = catalog.accelerator(accelerator)
    usable_bytes = acc.memory_bytes * (1 - resolved.memory.headroom_fraction)
    peak_bytes = np.broadcast_to(np.asarray(mem.peak_bytes, dtype=float), (len(grid),))
    held = device_memory(grid.job, peak_bytes, acc)  # what the device really holds decides the fit
    device_peak_bytes = np.broadcast_to(np.asarray(held.device_bytes, dtype=float), (len(grid),))
    reserved_peak_bytes = np.broadcast_to(np.asarray(held.reserved_bytes, dtype=float), (len(grid),))
    st, moe_options = fastest_moe_options(grid.job, hw, vendor=acc.vendor, fixed=fixed)
    # offloaded states must fit in the node's RAM too (toolkit.estimate.host)
    host_need, host_usable, _source = host_memory(resolved, catalog, model_state_bytes(grid.job).host_bytes)
    host_need = np.broadcast_to(host_need, (len(grid),))
    offer = catalog.offer(resolved.cost.offer) if resolved.cost.offer else None
    instances = math.ceil(count / offer.count) if offer is not None else None
    train_s, cost = _run_time_and_cost(grid, resolved, st, offer, instances)
    return {
        "grid": grid,
        "mem": peak_bytes,
        "reserved": reserved_peak_bytes,
        "device": device_peak_bytes,
        "st": st,
        "moe_options": moe_options,
        "band": band(regime_of(hw)),
        "network": _network(resolved, catalog),
        "train_s": train_s,
        "cost": cost,
        "cost_usd": catalog.to_usd(cost, offer.currency) if offer is not None else cost,
        "ok": grid.valid & (device_peak_bytes <= usable_bytes) & (host_need <= host_usable),
        "host": host_need,
        "accelerator": accelerator,
        "devices": count,
        "offer": resolved.cost.offer,
        "instances": instances,
        "usable": usable_bytes,
        "currency": offer.currency if offer else None,
        "global_batch": resolved.batch.global_batch,
        "tokens": resolved.tokens,
    }


def _run_time_and_cost(
    grid: LayoutGrid, resolved: Job, st: StepTime, offer: Offer | None, instances: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each layout's time to train its token budget, lengthened by spot interruptions (Young/Daly checkpoints) when
    priced on spot, and its cost in the offer's currency (NaN without a price)."""
    train_s = resolved.tokens / np.broadcast_to(np.asarray(st.tokens_per_s, dtype=float), (len(grid),))
    price = None if offer is None else (offer.spot_per_hour_high if resolved.cost.spot else offer.on_demand_per_hour)
    if price is not None and resolved.cost.spot:  # interruptions cost wall time (Young/Daly checkpoints)
        states = model_state_bytes(grid.job)
        train_s = spot_run(
            train_s,
            instances,
            resolved.cost.interruptions_per_month,
            states.params_bytes + states.optimizer_bytes + states.host_bytes,
            resolved.cost.checkpoint_write_bytes_per_s,
            resolved.cost.restart_s,
        ).wall_s
    cost = train_s / 3600 * instances * price if price is not None else np.full(len(grid), np.nan)
    return train_s, cost


def _rank(blocks: list[dict], job: Job, objective: str, top: int) -> tuple[list[dict], list[dict], int]:
    """Rank all fitting layouts of all clusters together (costs in US dollars, so offers in other currencies
    compare), then describe only the ones shown: the best `top`, pipelines simulated and near-ties marked, and the
    Pareto front when every plan has a price. Also returns how many layouts fit."""
    which = [(b, i) for b in blocks for i in np.flatnonzero(b["ok"])]
    times = np.array([b["train_s"][i] for b, i in which]) if which else np.zeros(0)
    costs = np.array([b["cost_usd"][i] for b, i in which]) if which else np.zeros(0)  # one currency to rank
    priced = costs[~np.isnan(costs)].size == costs.size and costs.size > 0
    sort_cost = np.where(np.isnan(costs), np.inf, costs)
    order = np.lexsort((times, sort_cost)) if objective == "cost" else np.lexsort((sort_cost, times))
    plans = [_describe(*which[i]) for i in order[:top]]
    budget = {"actions": SIMULATED_ACTIONS}  # and each pipeline simulated, by its times
    for plan in plans:
        _simulate_pipeline(plan, job, budget)
    _mark_within_error(plans, objective)
    pareto = [_describe(*which[i]) for i in pareto_front(times, costs)] if priced else []
    return plans, pareto, len(which)


def _describe(block: dict, i: int) -> dict:
    """One plan as plain values: where, which layout, its memory, step time, days and cost."""
    st, n = block["st"], len(block["grid"])
    pick = lambda v: float(np.broadcast_to(np.asarray(v, dtype=float), (n,))[i])  # noqa: E731
    return {
        "accelerator": block["accelerator"],
        "devices": block["devices"],
        "offer": block["offer"],
        "instances": block["instances"],
        "layout": block["grid"].layout(int(i)),
        "global_batch": block["global_batch"],
        "tokens": block["tokens"],
        "network": block["network"],
        "peak_bytes": float(block["mem"][i]),
        "reserved_peak_bytes": float(block["reserved"][i]),
        "device_peak_bytes": float(block["device"][i]),
        "host_bytes_per_node": float(block["host"][i]),
        "usable_bytes": block["usable"],
        "step_s": pick(st.step_s),
        "tokens_per_s": pick(st.tokens_per_s),
        "mfu": pick(st.mfu),
        "step_s_range": [
            pick(st.step_s) / (1 + block["band"]["error_high"]),
            pick(st.step_s) / (1 + block["band"]["error_low"]),
        ],
        "train_days": float(block["train_s"][i] / 86400),
        "cost": None if np.isnan(block["cost"][i]) else float(block["cost"][i]),
        "currency": block["currency"],
        "cost_usd": None if np.isnan(block["cost_usd"][i]) else float(block["cost_usd"][i]),
        "breakdown": {k: pick(v) for k, v in st.breakdown().items()},
        "stage_micro_s": [pick(v) for v in st.stage_micro_s],
        "moe": _moe_choice(block["moe_options"], i),
    }


def _moe_choice(options: dict | None, i: int) -> dict | None:
    """The dispatcher and overlap a plan was priced with (toolkit.plan.moe_options), or None where not searched."""
    if options is None:
        return None
    return {"dispatcher": str(options["dispatcher"][i]), "overlap_ep_comm": bool(options["ep_comm"][i])}


def _network(job: Job, catalog: Catalog) -> dict:
    """The network across nodes a cluster was priced with, and where the figure came from (the job's or its
    offer's, the accelerator's reference system, or the model's assumption)."""
    node_bytes, source = network_figure(job, catalog)
    return {"gbps_per_device": node_bytes * 8 / job.cluster.gpus_per_node / 1e9, "source": source}


def _mark_within_error(plans: list[dict], objective: str) -> None:
    """`within_error`: the model cannot tell the plan from the best. Two plans of one job on one stack share most
    of their error (the stack's speed against the model's), so they are compared with the error left once that is
    shared: the spread of steps predicted from another step of their own stack (the band's run_calibrated regime),
    not each one's whole likely range."""
    if not plans:
        return
    key = "train_days" if objective == "time" else "cost_usd"
    shared = band("run_calibrated")
    best = plans[0]
    for plan in plans:
        if plan[key] is None or best[key] is None:
            plan["within_error"] = plan["beats_best_probability"] = None
            continue
        low = plan[key] / (1 + shared["error_high"])
        best_high = best[key] / (1 + shared["error_low"])
        plan["within_error"] = bool(low <= best_high)
        plan["beats_best_probability"] = beats_probability(plan[key] / best[key], shared) if plan is not best else None


def beats_probability(ratio: float, shared: dict) -> float:
    """The chance a plan modelled `ratio` times #1's time (or cost) is in fact the better one: the error two plans of
    one stack do not share is the band's run_calibrated regime (the 10th-90th percentiles of one row's step predicted
    from another row of its source, i.e. of the ratio of two), read as a normal spread of the log of the ratio."""
    low, high = math.log1p(shared["error_low"]), math.log1p(shared["error_high"])
    sigma = (high - low) / (2 * NormalDist().inv_cdf(0.9))
    return NormalDist().cdf(-math.log(ratio) / sigma)


SIMULATED_ACTIONS = 20_000
"""Forward and backward actions the event simulator may run per search (about 0.15 s on 2 cores)."""


def _simulate_pipeline(plan: dict, job: Job, budget: dict) -> None:
    """Check a pipelined plan's closed form with the schedule simulator (toolkit.estimate.pipeline) on its own
    per-chunk times: the first rank's blocks, the last chunk with the output projection. Adds plan["pipeline"];
    plans whose pipelines are the same (they differ in ZeRO or offload) are simulated once."""
    lay = plan["layout"]
    p, v = lay["pp"], lay["vpp"]
    if p == 1:
        return
    m = plan["global_batch"] // (lay["micro_batch"] * lay["dp"])
    actions = 2 * m * p * v
    closed_s = sum(
        plan["breakdown"][k] for k in ("compute_s", "memory_bound_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "bubble_s")
    )
    plan["pipeline"] = {"closed_form_s": closed_s, "simulated_s": None, "bubble_fraction": None}
    key = (p, v, m, tuple(round(t, 12) for t in plan["stage_micro_s"]))
    if key not in budget:
        if actions > budget["actions"]:
            return
        budget["actions"] -= actions
        budget[key] = _simulated(plan, job, p, v, m)
    plan["pipeline"].update(budget[key])


def _simulated(plan: dict, job: Job, p: int, v: int, m: int) -> dict:
    sizes = chunk_layers(job.model.layers, p, v, job.parallel.stage_layers)
    first_s, _middle_s, last_s = plan["stage_micro_s"]
    per_layer_s = first_s / sum(sizes[0::p])
    chunk_s = [per_layer_s * n for n in sizes]
    chunk_s[-1] += last_s - per_layer_s * sum(sizes[p - 1 :: p])  # the output projection
    timeline = simulate(
        "interleaved" if v > 1 else job.parallel.schedule,
        p,
        m,
        v,
        forward_s=[t / 3 for t in chunk_s],
        backward_s=[2 * t / 3 for t in chunk_s],
    )
    return {"simulated_s": timeline.step_s, "bubble_fraction": timeline.bubble_fraction}


def plan_job(job: Job, plan: dict) -> Job:
    """The job a plan describes (its devices, layout, micro-batch and recompute), e.g. to write with --write-job."""
    lay = plan["layout"]
    out = job.replace(
        cluster=dataclasses.replace(job.cluster, accelerator=plan["accelerator"], count=plan["devices"]),
        parallel=dataclasses.replace(
            job.parallel,
            stage_layers=None,
            partition=None,  # (the plan's split rule)
            **{
                k: lay[k] for k in ("dp", "tp", "pp", "vpp", "cp", "sp", "zero", "dp_replicate", "ep", "etp", "offload")
            },
        ),
        batch=dataclasses.replace(job.batch, micro_batch=lay["micro_batch"]),
        memory=dataclasses.replace(job.memory, recompute=lay["recompute"]),
        cost=dataclasses.replace(job.cost, offer=plan["offer"] or job.cost.offer),
    )
    moe = plan.get("moe")
    if moe:  # the dispatcher and overlap the plan was priced with
        out = out.replace(
            moe=dataclasses.replace(job.moe, dispatcher=moe["dispatcher"]),
            overlap=dataclasses.replace(job.overlap, ep_comm=moe["overlap_ep_comm"]),
        )
    return out
