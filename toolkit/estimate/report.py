"""`estimate(job)`: every figure the toolkit can give for a Job, as the CLI's JSON contract.

Fields not modelled yet are None (JSON null), never zero, so nobody mistakes a gap for
an answer. Memory figures are per device, for the busiest device.
"""

from __future__ import annotations

import numpy as np

from ..specs.catalog import Catalog, load_catalog
from ..specs.errors import SpecError
from ..specs.job import Job, compute_dtype
from .band import regime_of, step_range
from .cost import offer_cost, train_seconds
from .device import device_memory
from .flops import PF_DAY_FLOPS, flops_per_token, training_flops
from .hardware import ASSUMED_NETWORK_BITS_PER_DEVICE, hardware_for, network_figure
from .host import host_memory
from .memory import memory_estimate, memory_notes
from .params import count_params
from .result import ComputePart, CostPart, Estimate, MemoryPart, ModelPart, TimePart
from .serving import serving_estimate
from .spot import spot_run
from .states import job_params_per_device, model_state_bytes
from .steptime import overlap_settings, step_time

__all__ = ["estimate", "estimate_result"]


def estimate(job: Job, catalog: Catalog | None = None) -> dict:
    """Resolve `job` (filling defaults, raising SpecError on bad input) and estimate it: the JSON contract. A
    serving job (`workload: inference`) gets toolkit.estimate.serving's figures instead of a training step's."""
    if job.workload == "inference":
        catalog = catalog or load_catalog()
        resolved, notes = job.resolve(catalog)
        return serving_estimate(resolved, catalog, notes)
    return estimate_result(job, catalog).to_dict()


def estimate_result(job: Job, catalog: Catalog | None = None) -> Estimate:
    """The same as typed parts (toolkit.estimate.result), for widgets and plots."""
    catalog = catalog or load_catalog()
    if job.workload == "inference":
        raise SpecError("workload", "inference", "a serving job's figures come from estimate() (a dict), not Estimate")
    job, notes = job.resolve(catalog)
    model = job.model
    accelerator = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    params = count_params(model)
    mem = memory_estimate(job) if model.has_shape and not model.encoder else None
    states = mem.states if mem is not None else model_state_bytes(job)
    memory = _memory_part(job, catalog, mem, states, accelerator, notes)
    compute, per_token, flops = _compute_part(job, notes)
    time, steps = _time_part(job, catalog, accelerator, compute, per_token, flops, notes)
    return Estimate(
        job=job.to_dict(),
        notes=notes,
        model=ModelPart(
            name=model.name,
            params=params.total,
            params_non_embedding=params.non_embedding,
            params_per_device=job_params_per_device(job),
            active_params=params.active,
        ),
        memory=memory,
        compute=compute,
        time=time,
        cost=_cost_part(job, catalog, time.train_s, states, accelerator, notes),
    )


def _memory_part(job: Job, catalog: Catalog, mem, states, accelerator, notes: list[str]) -> MemoryPart:
    """The busiest device's memory, and whether it fits: decided on what the device holds, not the tensors, and
    on what its node's host holds where states are offloaded (toolkit.estimate.host)."""
    notes.extend(memory_notes(job, mem))
    device_bytes = accelerator.memory_bytes if accelerator else None
    usable = None if device_bytes is None else device_bytes * (1 - job.memory.headroom_fraction)
    held = device_memory(job, mem.peak_bytes, accelerator) if accelerator and mem is not None else None
    fits = None
    if usable is not None and held is not None:
        fits = held.device_bytes <= usable
        notes.append(_device_note(held, job))
        if not fits:
            notes.append(
                f"device peak {held.device_bytes / 2**30:.1f} GiB (tensors {mem.peak_bytes / 2**30:.1f} GiB "
                f"at {mem.peak_phase}) exceeds the {usable / 2**30:.1f} GiB usable on {accelerator.name}"
            )
    elif usable is not None and states.total_bytes > usable:
        fits = False
        notes.append(
            f"model states alone need {states.total_bytes / 2**30:.1f} GiB per device, more than the "
            f"{usable / 2**30:.1f} GiB usable on {accelerator.name}"
        )
    host = _host_part(job, catalog, states, notes)
    if host and host["host_bytes_per_node"] > host["host_usable_bytes_per_node"]:
        fits = False
    return MemoryPart(
        **host,
        params_bytes=states.params_bytes,
        grads_bytes=states.grads_bytes,
        optimizer_bytes=states.optimizer_bytes,
        states_bytes=states.total_bytes,
        activations_bytes=mem.activations_bytes if mem else None,
        peak_bytes=mem.peak_bytes if mem else None,
        peak_phase=mem.peak_phase if mem else None,
        reserved_peak_bytes=held.reserved_bytes if held else None,
        device_peak_bytes=held.device_bytes if held else None,
        device_terms=held.terms() if held else None,
        expandable_segments=job.memory.expandable_segments,
        program=job.memory.program,
        host_bytes=states.host_bytes,
        device_bytes=device_bytes,
        usable_bytes=usable,
        fits=fits,
    )


def _host_part(job: Job, catalog: Catalog, states, notes: list[str]) -> dict:
    """Offloaded states against the node's RAM: the figures, and a note when they do not fit or the RAM is assumed."""
    if not states.host_bytes or not job.cluster.accelerator:
        return {}
    need, have, source = host_memory(job, catalog, states.host_bytes)
    need = float(need)
    gib = 2**30
    if need > have:
        notes.append(
            f"does not fit: offload puts {need / gib:,.0f} GiB of states in each node's host memory, which may use "
            f"{have / gib:,.0f} GiB ({_HOST_SOURCE[source]}); offload less, shard over more nodes, or give "
            "--host-memory-gib for your nodes"
        )
    elif source == "assumed":
        notes.append(
            f"host memory: {need / gib:,.0f} GiB of offloaded states a node against an assumed "
            f"{have / gib:,.0f} GiB usable; give --host-memory-gib (or an offer that lists its RAM)"
        )
    return {"host_bytes_per_node": need, "host_usable_bytes_per_node": have, "host_memory_source": source}


_HOST_SOURCE = {
    "given": "--host-memory-gib",
    "offer": "the offer's RAM",
    "accelerator": "its reference system's RAM",
    "assumed": "an assumed 128 GiB a GPU",
}
"""Where a node's RAM figure came from, in the words a note uses (toolkit.estimate.host)."""


def _compute_part(job: Job, notes: list[str]):
    """(the FLOPs of the whole run, the per-token count of the runner's model or None, 6·N·D's figures or None)."""
    model = job.model
    flops = training_flops(model, count_params(model).active, job.tokens) if job.tokens else None
    per_token = flops_per_token(job) if model.has_shape and not model.encoder else None
    total = hardware = attention = None
    if flops is not None and per_token is not None:  # the exact matmul count of the runner's model
        total, hardware = per_token.model * job.tokens, per_token.hardware * job.tokens
        attention = 3 * per_token.attention * job.tokens
    elif flops is not None:  # encoders and size-only models: 6·N·D (+ attention)
        total, attention = flops.total_flops, flops.attention_flops
    if job.tokens is None and job.workload != "finetune":  # (a fine-tune's own note says what to give)
        notes.append("no token budget: give --tokens for FLOPs, time and cost")
    return (
        ComputePart(
            flops_6nd=flops.flops_6nd if flops else None,
            attention_flops=attention,
            total_flops=total,
            hardware_flops=hardware,
            model_flops_per_token=per_token.model if per_token else None,
            hardware_flops_per_token=per_token.hardware if per_token else None,
            pf_days=None if total is None else total / PF_DAY_FLOPS,
            pf_days_6nd=flops.flops_6nd / PF_DAY_FLOPS if flops else None,
            attention_convention=flops.convention if flops else None,
        ),
        per_token,
        flops,
    )


def _time_part(job: Job, catalog: Catalog, accelerator, compute: ComputePart, per_token, flops, notes: list[str]):
    """(time to train from the given MFU or the step-time model, the step-time model's result or None)."""
    devices = job.cluster.count
    dtype = compute_dtype(job.precision.mode)
    peak = accelerator.peak_flops(dtype) if accelerator else None
    if accelerator is not None and peak is None:
        notes.append(f"{accelerator.name} has no published {dtype} peak: time needs one (see its catalog row)")
    train_s = None
    work = compute.total_flops if compute.total_flops is not None else (flops.flops_6nd if flops else None)
    hw = hardware_for(job, catalog) if per_token is not None else None
    steps = step_time(job, hw) if hw is not None else None
    if hw is not None and devices > job.cluster.gpus_per_node:
        net, where = network_figure(job, catalog)
        per_device = net * 8 / job.cluster.gpus_per_node / 1e9
        if where == "accelerator":
            notes.append(
                f"network across nodes: {per_device:.0f} Gb/s per device, {accelerator.name}'s reference "
                f"system ({accelerator.network_source.split(':')[0]}); give cluster.inter_node_bw_bytes_per_s "
                "or an offer (--offer) for your cluster's"
            )
        elif where == "assumed":
            notes.append(
                f"network across nodes: {ASSUMED_NETWORK_BITS_PER_DEVICE / 1e9:.0f} Gb/s per device assumed "
                "(DGX A100 class), not a published figure for this cluster: give "
                "cluster.inter_node_bw_bytes_per_s or an offer (--offer) whose row has one"
            )
    step = {}
    if steps is not None:
        overlap = {k: bool(v) for k, v in overlap_settings(job).items()}
        low, high = step_range(float(steps.step_s), regime_of(hw))
        step = dict(
            step_s=steps.step_s,
            step_s_range=[low, high],
            step_s_regime=regime_of(hw),
            provenance=PROVENANCE[regime_of(hw)],
            tokens_per_s=steps.tokens_per_s,
            mfu_modelled=steps.mfu,
            hfu_modelled=steps.mfu * per_token.hardware / per_token.model,
            breakdown=steps.breakdown(),
            gemm_efficiency=steps.gemm_efficiency,
            overlap=overlap,
        )
        if job.devices > 1:
            notes.append(_overlap_note(job, overlap))
        notes.extend(_regime_notes(job, hw, accelerator))
    if work is not None and peak is not None and job.mfu is not None:
        train_s = train_seconds(work, devices, peak, job.mfu)
        if compute.total_flops is None:
            notes.append("time counts 6·N·D only: a size-only model has no attention term")
    elif work is not None and steps is not None:
        train_s = job.tokens / steps.tokens_per_s
    elif work is not None and peak is not None:
        notes.append("time needs an MFU: give --mfu (e.g. 0.4; published runs reach 0.2-0.55)")
    return TimePart(
        dtype=dtype,
        peak_flops_per_device=peak,
        mfu=job.mfu if job.mfu is not None else step.get("mfu_modelled"),
        mfu_source="given" if job.mfu is not None else ("step-time model" if steps is not None else None),
        train_s=train_s,
        train_days=None if train_s is None else train_s / 86400,
        device_hours=None if train_s is None else train_s * devices / 3600,
        **step,
    ), steps


PROVENANCE = {"run_calibrated": "calibrated", "calibrated": "calibrated", "kernel_profile": "modelled",
              "assumed": "assumed"}  # fmt: skip
"""A step's provenance by the regime of its band (toolkit.estimate.band.regime_of)."""


def _regime_notes(job: Job, hw, accelerator) -> list[str]:
    """Where the step-time model has no measurement to stand on, said plainly; where it was scaled to the user's
    own measured step, by how much and why its range changed."""
    notes = []
    if regime_of(hw) == "run_calibrated":
        cal = accelerator.step_calibration
        notes.append(
            f"step time: calibrated on your run ({cal['job']}: measured {cal['measured_step_s']:.4g} s, modelled "
            f"{cal['modelled_step_s']:.4g} s): "
            + (
                f"compute x{hw.step_scale:.3f}, collectives x{hw.communication_scale:.3f}"
                if hw.communication_scale is not None
                else f"every part of the step x{hw.step_scale:.3f}"
            )
            + "; its likely "
            "range is that of runs predicted from one measured step of their own stack, narrower than a new "
            "stack's (benchmarks/steptime_accuracy.py)"
        )
    if regime_of(hw) == "assumed":
        notes.append(
            f"step time: {job.cluster.accelerator} has no kernel profile (toolkit/data/kernels.yaml): its "
            "matmuls, attention and element-wise rates are the model's assumptions, and its likely range "
            "is a wide ±50 % until measured kernels or `toolkit calibrate` replace them"
        )
    if (
        hw.kernels is not None
        and job.memory.attention != "eager"
        and np.any(job.model.seq_len / np.asarray(job.parallel.cp) > max(hw.kernels.seq_lens))
    ):
        notes.append(
            f"step time: fused attention was measured up to {max(hw.kernels.seq_lens):,} tokens; "
            "longer sequences are priced at that length's rate"
        )
    if job.precision.fp8 and hw.kernels is not None:
        notes.append(
            "step time: FP8 matmuls are priced at their measured best rate (MAMF); no FP8 training run is "
            "among the model's checks (benchmarks/steptime_accuracy.py)"
        )
    if job.parallel.tp > job.cluster.gpus_per_node:
        notes.append("step time: tensor parallelism across nodes has no measured run among the model's checks")
    return notes


def _cost_part(job: Job, catalog: Catalog, train_s, states, accelerator, notes: list[str]) -> CostPart:
    """The offer's price for the run (and, on spot instances, the interruptions' cost), and the energy."""
    cost = {"offer": job.cost.offer, "spot": job.cost.spot}
    if job.cost.offer:
        offer = catalog.offer(job.cost.offer)
        oc = offer_cost(offer, job.cluster.count, train_s, job.cost.spot)
        cost.update(
            offer=offer.name,
            instances=oc.instances,
            price_per_hour=oc.price_per_hour,
            amount=oc.amount,
            amount_spot_low=oc.amount_spot_low,
            currency=oc.currency,
            amount_usd=catalog.to_usd(oc.amount, oc.currency),
        )
        if oc.price_per_hour is None:
            kind = "spot" if job.cost.spot else "on-demand"
            notes.append(f"{offer.name} has no {kind} price in the catalog: add yours with --catalog my.yaml")
        if oc.idle_devices:
            notes.append(f"{oc.idle_devices} device(s) of the last {offer.name} instance are paid for but idle")
        if job.cost.spot and train_s is not None and oc.price_per_hour is not None:
            cost["spot_run"] = _spot_run(job, oc, train_s, states)
            notes.append(
                f"spot: {job.cost.interruptions_per_month:.0%} of instances reclaimed per month (an "
                "assumption: set cost.interruptions_per_month to your instance's Spot Advisor band)"
            )
    return CostPart(**cost, energy=_energy(job, train_s, accelerator))


def _spot_run(job: Job, oc, train_s: float, states) -> dict:
    run = spot_run(
        train_s,
        oc.instances,
        job.cost.interruptions_per_month,
        states.params_bytes + states.optimizer_bytes + states.host_bytes,
        job.cost.checkpoint_write_bytes_per_s,
        job.cost.restart_s,
    )
    return {
        "interval_s": run.interval_s,
        "checkpoint_write_s": run.checkpoint_write_s,
        "interruptions": run.interruptions,
        "overhead_fraction": run.overhead_fraction,
        "wall_s": run.wall_s,
        "amount": oc.instances * oc.price_per_hour * run.wall_s / 3600,
    }


def _energy(job: Job, train_s, accelerator) -> dict | None:
    """The accelerators at their TDP, times the facility's PUE (hosts and network not counted)."""
    if train_s is None or accelerator is None or not accelerator.tdp_w:
        return None
    kwh = job.cluster.count * accelerator.tdp_w * train_s / 3600 * job.cost.pue / 1000
    price, intensity = job.cost.energy_price_per_kwh, job.cost.grid_kg_co2_per_kwh
    return {
        "kwh": kwh,
        "pue": job.cost.pue,
        "amount": None if price is None else kwh * price,
        "co2_kg": None if intensity is None else kwh * intensity,
    }


def _device_note(held, job: Job) -> str:
    """What the device holds beyond the tensors, so that a reader sees why the fit is decided on more."""
    gib = 2**30
    return (
        f"beyond the tensors' {held.allocated_bytes / gib:.1f} GiB the device holds the allocator's pool "
        f"(+{held.fragmentation_bytes / gib:.1f} GiB fragmentation"
        f"{' with expandable segments' if job.memory.expandable_segments else ''}, "
        f"+{held.workspace_bytes / gib:.2f} GiB cuBLAS workspaces: reserved {held.reserved_bytes / gib:.1f} GiB), "
        f"the CUDA context ({held.context_bytes / gib:.2f} GiB) and communication buffers "
        f"({held.comm_bytes / gib:.2f} GiB for {int(held.comm_groups)} group(s)"
        f"{f' of {held.comm_channels} NCCL channels' if held.comm_channels else ''} and {int(held.p2p_peers)} "
        f"pipeline peer(s)): {held.device_bytes / gib:.1f} GiB as nvidia-smi shows it; the fit is decided on that"
    )


def _overlap_note(job: Job, overlap: dict) -> str:
    """Which communication the step hides, and whether that is the backend's default or the job's choice."""
    said = {
        "grad_reduce": job.overlap.grad_reduce,
        "param_gather": job.overlap.param_gather,
        "tp_comm": job.overlap.tp_comm or None,
    }
    names = {"grad_reduce": "gradient reduce", "param_gather": "parameter gathers", "tp_comm": "tp collectives"}
    parts = [
        f"{names[k]} {'overlapped' if v else 'not overlapped'}" + ("" if said[k] is not None else " (default)")
        for k, v in overlap.items()
    ]
    return (
        f"communication as {job.backend}'s program runs it: "
        + ", ".join(parts)
        + "; set overlap.grad_reduce / param_gather / tp_comm (--overlap-grad-reduce, ...) to change"
    )
