"""`estimate(job)`: every figure the toolkit can give for a Job, as the CLI's JSON contract.

Fields not modelled yet are None (JSON null), never zero, so nobody mistakes a gap for
an answer. Memory figures are per device, for the busiest device.
"""
from __future__ import annotations

import numpy as np

from ..specs.catalog import Catalog, load_catalog
from ..specs.job import Job, compute_dtype
from .cost import offer_cost, train_seconds
from .device import device_memory
from .flops import PF_DAY_FLOPS, flops_per_token, training_flops
from .memory import memory_estimate, memory_notes
from .params import count_params
from .states import job_stage_layers, model_state_bytes, params_per_device
from .spot import spot_run
from .steptime import (ASSUMED_NETWORK_BITS_PER_DEVICE, hardware_for, node_network_bytes_per_s, overlap_settings,
                       step_time)

__all__ = ["estimate"]


def estimate(job: Job, catalog: Catalog | None = None) -> dict:
    """Resolve `job` (filling defaults, raising SpecError on bad input) and estimate it."""
    catalog = catalog or load_catalog()
    job, notes = job.resolve(catalog)
    model, par = job.model, job.parallel
    accelerator = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    devices = job.cluster.count

    # ---- model and memory ---------------------------------------------------------------
    params = count_params(model)
    mem = memory_estimate(job) if model.has_shape and not model.encoder else None
    states = mem.states if mem is not None else model_state_bytes(job)
    notes.extend(memory_notes(job, mem))
    device_bytes = accelerator.memory_bytes if accelerator else None
    usable = None if device_bytes is None else device_bytes * (1 - job.memory.headroom_fraction)
    held = device_memory(job, mem.peak_bytes, accelerator) if accelerator and mem is not None else None
    fits = None
    if usable is not None and held is not None:
        fits = held.device_bytes <= usable
        notes.append(_device_note(held, job))
        if not fits:
            notes.append(f"device peak {held.device_bytes / 2**30:.1f} GiB (tensors {mem.peak_bytes / 2**30:.1f} GiB "
                         f"at {mem.peak_phase}) exceeds the {usable / 2**30:.1f} GiB usable on {accelerator.name}")
    elif usable is not None and states.total_bytes > usable:
        fits = False
        notes.append(f"model states alone need {states.total_bytes / 2**30:.1f} GiB per device, more than the "
                     f"{usable / 2**30:.1f} GiB usable on {accelerator.name}")

    # ---- compute --------------------------------------------------------------------------
    flops = training_flops(model, params.total, job.tokens) if job.tokens else None
    per_token = flops_per_token(job) if model.has_shape and not model.encoder else None
    total = hardware = attention = None
    if flops is not None and per_token is not None:          # the exact matmul count of the runner's model
        total, hardware = per_token.model * job.tokens, per_token.hardware * job.tokens
        attention = 3 * per_token.attention * job.tokens
    elif flops is not None:                                   # encoders and size-only models: 6·N·D (+ attention)
        total, attention = flops.total_flops, flops.attention_flops
    if job.tokens is None:
        notes.append("no token budget: give --tokens for FLOPs, time and cost")

    # ---- time -------------------------------------------------------------------------------
    dtype = compute_dtype(job.precision.mode)
    peak = accelerator.peak_flops(dtype) if accelerator else None
    if accelerator is not None and peak is None:
        notes.append(f"{accelerator.name} has no published {dtype} peak: time needs one (see its catalog row)")
    train_s = None
    work = total if total is not None else (flops.flops_6nd if flops else None)
    hw = hardware_for(job, catalog) if per_token is not None else None
    steps = step_time(job, hw) if hw is not None else None
    if hw is not None and devices > job.cluster.gpus_per_node and node_network_bytes_per_s(job, catalog) is None:
        notes.append(f"network across nodes: {ASSUMED_NETWORK_BITS_PER_DEVICE / 1e9:.0f} Gb/s per device assumed "
                     "(DGX A100 class), not a published figure for this cluster: give "
                     "cluster.inter_node_bw_bytes_per_s or an offer (--offer) whose row has one")
    step = {"step_s": None, "tokens_per_s": None, "mfu_modelled": None, "hfu_modelled": None, "breakdown": None,
            "gemm_efficiency": None, "overlap": None}
    if steps is not None:
        overlap = {k: bool(v) for k, v in overlap_settings(job).items()}
        step.update(step_s=steps.step_s, tokens_per_s=steps.tokens_per_s, mfu_modelled=steps.mfu,
                    hfu_modelled=steps.mfu * per_token.hardware / per_token.model, breakdown=steps.breakdown(),
                    gemm_efficiency=steps.gemm_efficiency, overlap=overlap)
        if job.devices > 1:
            notes.append(_overlap_note(job, overlap))
    if work is not None and peak is not None and job.mfu is not None:
        train_s = train_seconds(work, devices, peak, job.mfu)
        if total is None:
            notes.append("time counts 6·N·D only: a size-only model has no attention term")
    elif work is not None and steps is not None:
        train_s = job.tokens / steps.tokens_per_s
    elif work is not None and peak is not None:
        notes.append("time needs an MFU: give --mfu (e.g. 0.4; published runs reach 0.2-0.55)")

    # ---- cost ----------------------------------------------------------------------------------
    cost = {"offer": job.cost.offer, "spot": job.cost.spot, "instances": None, "price_per_hour": None,
            "amount": None, "amount_spot_low": None, "currency": None, "amount_usd": None, "spot_run": None}
    if job.cost.offer:
        offer = catalog.offer(job.cost.offer)
        oc = offer_cost(offer, devices, train_s, job.cost.spot)
        cost.update(offer=offer.name, instances=oc.instances, price_per_hour=oc.price_per_hour,
                    amount=oc.amount, amount_spot_low=oc.amount_spot_low, currency=oc.currency,
                    amount_usd=catalog.to_usd(oc.amount, oc.currency))
        if oc.price_per_hour is None:
            kind = "spot" if job.cost.spot else "on-demand"
            notes.append(f"{offer.name} has no {kind} price in the catalog: add yours with --catalog my.yaml")
        if oc.idle_devices:
            notes.append(f"{oc.idle_devices} device(s) of the last {offer.name} instance are paid for but idle")
        if job.cost.spot and train_s is not None and oc.price_per_hour is not None:
            run = spot_run(train_s, oc.instances, job.cost.interruptions_per_month,
                           states.params_bytes + states.optimizer_bytes + states.host_bytes,
                           job.cost.checkpoint_write_bytes_per_s, job.cost.restart_s)
            cost["spot_run"] = {"interval_s": run.interval_s, "checkpoint_write_s": run.checkpoint_write_s,
                                "interruptions": run.interruptions, "overhead_fraction": run.overhead_fraction,
                                "wall_s": run.wall_s,
                                "amount": oc.instances * oc.price_per_hour * run.wall_s / 3600}
            notes.append(f"spot: {job.cost.interruptions_per_month:.0%} of instances reclaimed per month (an "
                         "assumption: set cost.interruptions_per_month to your instance's Spot Advisor band)")

    # ---- energy: the accelerators at their TDP, times the facility's PUE (hosts and network not counted)
    energy = None
    if train_s is not None and accelerator is not None and accelerator.tdp_w:
        kwh = devices * accelerator.tdp_w * train_s / 3600 * job.cost.pue / 1000
        price, intensity = job.cost.energy_price_per_kwh, job.cost.grid_kg_co2_per_kwh
        energy = {"kwh": kwh, "pue": job.cost.pue, "amount": None if price is None else kwh * price,
                  "co2_kg": None if intensity is None else kwh * intensity}
    cost["energy"] = energy

    return _plain({
        "job": job.to_dict(),
        "notes": notes,
        "model": {
            "name": model.name,
            "params": params.total,
            "params_non_embedding": params.non_embedding,
            "params_per_device": params_per_device(model, par.tp, par.pp, None, job_stage_layers(job)),
        },
        "memory": {
            "params_bytes": states.params_bytes,
            "grads_bytes": states.grads_bytes,
            "optimizer_bytes": states.optimizer_bytes,
            "states_bytes": states.total_bytes,
            "activations_bytes": mem.activations_bytes if mem else None,
            "peak_bytes": mem.peak_bytes if mem else None,
            "peak_phase": mem.peak_phase if mem else None,
            "reserved_peak_bytes": held.reserved_bytes if held else None,
            "device_peak_bytes": held.device_bytes if held else None,
            "device_terms": held.terms() if held else None,
            "expandable_segments": job.memory.expandable_segments,
            "program": job.memory.program,
            "host_bytes": states.host_bytes,
            "device_bytes": device_bytes,
            "usable_bytes": usable,
            "fits": fits,
        },
        "compute": {
            "flops_6nd": flops.flops_6nd if flops else None,
            "attention_flops": attention,
            "total_flops": total,
            "hardware_flops": hardware,
            "model_flops_per_token": per_token.model if per_token else None,
            "hardware_flops_per_token": per_token.hardware if per_token else None,
            "pf_days": None if total is None else total / PF_DAY_FLOPS,
            "pf_days_6nd": flops.flops_6nd / PF_DAY_FLOPS if flops else None,
            "attention_convention": flops.convention if flops else None,
        },
        "time": {
            "dtype": dtype,
            "peak_flops_per_device": peak,
            "mfu": job.mfu if job.mfu is not None else step["mfu_modelled"],
            "mfu_source": "given" if job.mfu is not None else ("step-time model" if steps is not None else None),
            "train_s": train_s,
            "train_days": None if train_s is None else train_s / 86400,
            "device_hours": None if train_s is None else train_s * devices / 3600,
            **step,
        },
        "cost": cost,
    })


def _plain(value):
    """Numpy scalars and 0-d arrays (the array-capable model's results for one job) as Python numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.item()
    return value


def _device_note(held, job: Job) -> str:
    """What the device holds beyond the tensors, so that a reader sees why the fit is decided on more."""
    gib = 2**30
    return (f"beyond the tensors' {held.allocated_bytes / gib:.1f} GiB the device holds the allocator's pool "
            f"(+{held.fragmentation_bytes / gib:.1f} GiB fragmentation"
            f"{' with expandable segments' if job.memory.expandable_segments else ''}, "
            f"+{held.workspace_bytes / gib:.2f} GiB cuBLAS workspaces: reserved {held.reserved_bytes / gib:.1f} GiB), "
            f"the CUDA context ({held.context_bytes / gib:.2f} GiB) and communication buffers "
            f"({held.comm_bytes / gib:.2f} GiB for {int(held.comm_groups)} group(s) and {int(held.p2p_peers)} pipeline "
            f"peer(s)): {held.device_bytes / gib:.1f} GiB as nvidia-smi shows it; the fit is decided on that")


def _overlap_note(job: Job, overlap: dict) -> str:
    """Which communication the step hides, and whether that is the backend's default or the job's choice."""
    said = {"grad_reduce": job.overlap.grad_reduce, "param_gather": job.overlap.param_gather,
            "tp_comm": job.overlap.tp_comm or None}
    names = {"grad_reduce": "gradient reduce", "param_gather": "parameter gathers", "tp_comm": "tp collectives"}
    parts = [f"{names[k]} {'overlapped' if v else 'not overlapped'}" + ("" if said[k] is not None else " (default)")
             for k, v in overlap.items()]
    return (f"communication as {job.backend}'s program runs it: " + ", ".join(parts)
            + "; set overlap.grad_reduce / param_gather / tp_comm (--overlap-grad-reduce, ...) to change")
