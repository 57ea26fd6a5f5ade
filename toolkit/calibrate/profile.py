"""Measure this machine's figures and write them as a catalog row the step-time model can use.

    toolkit calibrate --nproc 2 --config job.yaml --out profile.yaml
    toolkit compare --run runs/demo --catalog profile.yaml     # the model with these figures against the run

Every rank measures at once, as in training (every rank busy, each with the runner's thread count and, on CPU,
its deterministic kernels): the matmul and fused-attention rates inside one rank's share of the job's own model
under torch's profiler (a sweep of square shapes without a job), the memory bandwidth of a large element-wise op,
the fixed cost of one operation and of one checkpointed region, and collectives on the process group (all-reduces
from 4 KiB to 16 MiB, fitted as latency + bytes / bandwidth; reduce-scatter and all-gather bandwidth; the fixed
cost of one tensor-parallel collective as the runner's DTensor plan issues it in one of the job's blocks; the cost
of one FSDP2 collective beyond its bytes, as the runner shards the job's blocks). The last two are measured for
every job, as if it ran tensor-parallel or FSDP2 over the ranks where it does not (`as_tp`, `as_fsdp`): one
calibration prices every layout the planner weighs, not only the job's own.
The row's peak is the job's matmuls' rate (their FLOPs over their time inside the model) lifted to the rate of large
matrices by `gemm_half_size`, the size at which a dimension halves a product's rate, fitted to the job's products
timed with their rows halved and doubled; so the profile sets the model's `gemm_fraction` to 1 (the model slows
thin shapes by that size and the roofline) and `link_efficiency` to 1 (the bandwidth is the one achieved).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import importlib
import os
import platform
import sys

import torch
import yaml

from ..program.precision import TORCH_DTYPES
from ..specs.catalog import DTYPES as DTYPE_NAMES
from ..specs.dims import ParallelDims
from ..specs.errors import SpecError
from ..specs.job import Job, compute_dtype
from ..specs.precision import TORCH_SEMANTICS
from .comm import collective_fit, fsdp_collective_s, sharded_bw_bytes_per_s, tp_collective_s
from .decode import decode_bw_bytes_per_s, inference_op_overhead_s
from .kernels import (
    IN_MODEL_LAYERS,
    SWEEP,
    attention_flops,
    checkpoint_overhead_s,
    elementwise_bw_bytes_per_s,
    half_size,
    head_shape,
    in_model_rates,
    job_shapes,
    kernel_totals,
    matmul_flops,
    memory_bw_bytes_per_s,
    op_overhead_s,
    ops_per_unit,
    optimizer_params_per_s,
    selective_op_overhead_s,
    thin_shapes,
)
from .serve_host import serve_host

__all__ = ["calibrate", "measure_rank", "profile_row", "in_model_rates", "kernel_totals", "job_shapes"]


def measure_rank(job: Job, rank: int, world: int) -> dict:
    """One rank's figures, measured while every other rank measures the same, with a training rank's settings:
    its thread count and, on CPU, deterministic kernels (toolkit.launch.determinism.pinned)."""
    importlib.import_module("toolkit.train.loop")  # what a training rank loads (accelerate, the runner)
    from ..launch.determinism import pinned, rank_threads

    with pinned(rank_threads(world), "cpu"):  # (its kernels run on CPU cores, GPU or not)
        return _measure_rank(job, rank, world)


def _measure_rank(job: Job, rank: int, world: int) -> dict:
    mode = job.precision.mode or "fp32"
    dtype = TORCH_DTYPES[compute_dtype(mode)]
    shaped = job.model.has_shape
    serving = job.workload == "inference"
    shapes = job_shapes(job) if shaped else [(n, n, n) for n in SWEEP]
    bandwidth, latency = collective_fit(world)
    reduce_scatter_bw, gather_bw = sharded_bw_bytes_per_s(world)
    figures = {
        "rank": rank,
        "dtype": compute_dtype(mode),
        "shapes": [list(s) for s in shapes],
        **_compute_rates(job, shapes, dtype),
        "memory_bw_bytes_per_s": elementwise_bw_bytes_per_s(job, dtype) if shaped else memory_bw_bytes_per_s(),
        "optimizer_params_per_s": optimizer_params_per_s(job),
        "op_overhead_s": op_overhead_s(),
        # a serving job's decode figures (a training job's calibration does not need them)
        "inference_op_overhead_s": inference_op_overhead_s(job) if serving else None,
        "decode_bw_bytes_per_s": decode_bw_bytes_per_s(job, dtype) if shaped and serving else None,
        "serve_host": serve_host(job.model.vocab) if shaped and serving and rank == 0 else None,
        "checkpoint_overhead_s": checkpoint_overhead_s(job) if shaped else None,
        "ops_per_unit": ops_per_unit(job) if shaped and not job.model.encoder else None,
        "selective_op_overhead_s": selective_op_overhead_s(job) if shaped and not job.model.encoder else None,
        "bus_bw_bytes_per_s": bandwidth,
        "latency_s": latency,
        "tp_collective_s": tp_collective_s(as_tp(job, world), world, dtype, bandwidth) if shaped else None,
        "fsdp_collective_s": fsdp_collective_s(as_fsdp(job, world), world, reduce_scatter_bw, gather_bw)
        if shaped
        else None,
        "reduce_scatter_bw_bytes_per_s": reduce_scatter_bw,
        "gather_bw_bytes_per_s": gather_bw,
    }
    gc.collect()
    figures["baseline_bytes"] = _resident_bytes()  # the rank with its code, threads and gloo buffers, tensors freed
    return figures


def as_fsdp(job: Job, world: int) -> Job:
    """The job as FSDP2 would run it over the world (ZeRO-3, torch's program), so that one calibration prices
    every layout's collectives, not only its own job's: a DDP job's profile must still predict a ZeRO-3 run.
    The job itself where it runs FSDP2 already, or where its precision is not torch's (Megatron's, DeepSpeed's)."""
    par = job.parallel
    if ParallelDims.from_job(job).fsdp or job.precision.mode not in TORCH_SEMANTICS:
        return job
    return job.replace(
        parallel=dataclasses.replace(
            par,
            zero=3,
            tp=1,
            pp=1,
            vpp=1,
            dp=world,
            sp=False,
            offload="none",
            dp_replicate=1,
            stage_layers=None,
            partition=None,
            backend="torch",
        )
    )


def as_tp(job: Job, world: int) -> Job:
    """The job with tensor parallelism over the world where it has none and its heads split so (the cost of one
    DTensor collective, for tensor-parallel layouts the planner weighs against the job's own)."""
    par, m = job.parallel, job.model
    if (
        par.tp > 1
        or world < 2
        or job.precision.mode not in TORCH_SEMANTICS
        or not m.has_shape
        or m.heads % world
        or m.kv_heads_ % world
    ):
        return job
    return job.replace(
        parallel=dataclasses.replace(
            par, tp=world, dp=1, pp=1, vpp=1, zero=0, sp=False, stage_layers=None, partition=None
        )
    )


def _compute_rates(job: Job, shapes, dtype: torch.dtype) -> dict:
    """Matmul and attention rates: inside the job's model where the runner can build it, else at the job's
    shapes alone (or a sweep of square shapes without a job). Each as the large-matrix rate and the half-rate
    size (`gemm_half_size`) fitted to the products around the job's (rows halved and doubled): the model slows
    each product by its thin dimensions, so a micro-batch other than the job's is priced at its own shapes."""
    around = thin_shapes(shapes) if job.model.has_shape else list(shapes)
    timed = around + list(shapes) if job.model.has_shape else around
    if not job.model.has_shape or job.model.encoder:  # (the runner's GPT builds decoders)
        rate, half = half_size(timed, matmul_flops(timed, dtype, rounds=2))
        return {
            "matmul_flops": [rate],
            "gemm_half_size": half,
            "attention_flops": attention_flops(job, dtype) if job.model.has_shape else None,
            "in_model": False,
        }
    matmul, attention = in_model_rates(job)
    _rate, half = half_size(timed, matmul_flops(timed, dtype, rounds=2))
    return {
        "matmul_flops": [_large_matrix_rate(job, matmul, half)],
        "gemm_half_size": half,
        "attention_flops": attention or attention_flops(job, dtype),
        "in_model": True,
    }


def _large_matrix_rate(job: Job, rate: float, half: float) -> float:
    """The rate the job's model ran its products at, lifted to the large-matrix rate: their FLOPs (the blocks'
    products and the vocabulary projection, as in_model_rates times them) times each one's thin factor, over
    their FLOPs."""
    from ..estimate.steptime import block_matmul_shapes, thin_factor

    blocks = min(job.model.layers, IN_MODEL_LAYERS)
    weighted = [(shape, blocks) for shape in block_matmul_shapes(job)] + [(head_shape(job), 1)]
    flops = sum(count * m * k * n for (m, k, n), count in weighted)
    slowed = sum(count * m * k * n * thin_factor(m, k, n, half) for (m, k, n), count in weighted)
    return rate * float(slowed) / float(flops)


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def profile_row(ranks: list[dict], world: int) -> dict:
    """The catalog row (accelerators: [row]) of what the ranks measured: the slowest rank's figures."""
    host, today = platform.node() or "this-host", datetime.date.today().isoformat()
    dtype = ranks[0]["dtype"]
    # the job's matmuls together: their FLOPs over their time (the roofline only slows thin shapes further)
    peak = min(len(r["matmul_flops"]) / sum(1 / x for x in r["matmul_flops"]) for r in ranks)
    bus = ranks[0]["bus_bw_bytes_per_s"]
    assumptions = {
        "gemm_fraction": 1.0,
        "link_efficiency": 1.0,
        "comm_overlaps_compute": False,  # measured on CPU cores (gloo), which do both in turn
        "op_overhead_s": max(r["op_overhead_s"] for r in ranks),
        "optimizer_params_per_s": min(r["optimizer_params_per_s"] for r in ranks),
    }
    if ranks[0]["attention_flops"]:
        assumptions["attention_fraction"] = min(r["attention_flops"] for r in ranks) / peak
    if ranks[0]["latency_s"] is not None:
        assumptions["latency_intra_s"] = ranks[0]["latency_s"]
    if ranks[0].get("decode_bw_bytes_per_s") is not None:
        assumptions["decode_bw_bytes_per_s"] = min(r["decode_bw_bytes_per_s"] for r in ranks)
    if ranks[0].get("serve_host") is not None:  # `toolkit generate --serve`'s own loop and streaming
        assumptions.update(ranks[0]["serve_host"])
    if ranks[0].get("inference_op_overhead_s") is not None:
        assumptions["inference_op_overhead_s"] = max(r["inference_op_overhead_s"] for r in ranks)
    for key in ("reduce_scatter_bw_bytes_per_s", "gather_bw_bytes_per_s"):
        if ranks[0].get(key) is not None:
            assumptions[key] = ranks[0][key]
    for key in ("tp_collective_s", "fsdp_collective_s"):
        if ranks[0].get(key) is not None:
            assumptions[key] = ranks[0][key]
    halves = sorted(r["gemm_half_size"] for r in ranks if r.get("gemm_half_size") is not None)
    if halves:
        assumptions["gemm_half_size"] = halves[len(halves) // 2]
    for key in ("checkpoint_overhead_s", "ops_per_unit", "selective_op_overhead_s"):
        if ranks[0].get(key) is not None:
            assumptions[key] = max(r[key] for r in ranks)
    baselines = [r["baseline_bytes"] for r in ranks if r.get("baseline_bytes")]
    row = {
        "name": f"measured-{host}",
        "vendor": "measured",
        "memory_bytes": _memory_bytes(world),
        "memory_bw_bytes_per_s": min(r["memory_bw_bytes_per_s"] for r in ranks),
        "link_bw_bytes_per_s": 2 * bus if bus else "unknown",
        "tdp_w": "unknown",
        "peak_tflops": {**{d: "unknown" for d in DTYPE_NAMES}, dtype: peak / 1e12},
        "assumptions": assumptions,
        # what a CPU rank holds beyond its tensors: the process itself (interpreter, torch's code and data, the
        # gloo group), measured; no CUDA context, cuBLAS workspace, caching allocator or NCCL buffers
        **(
            {
                "device_memory": {
                    "context_bytes": max(baselines),
                    "workspace_bytes": 0,
                    "fragmentation": 0.0,
                    "fragmentation_expandable": 0.0,
                    "communicator_bytes": 0,
                }
            }
            if baselines
            else {}
        ),
        "source": f"measured on {host}, {today} by toolkit calibrate ({world} rank(s) busy at once, "
        + (
            f"matmuls and attention timed inside the job's model, {dtype}, forward and backward)"
            if ranks[0].get("in_model")
            else f"{len(ranks[0]['shapes'])} matmul shapes in {dtype}, forward and backward)"
        ),
        "as_of": today,
    }
    return {"accelerators": [row]}


def _memory_bytes(world: int) -> int | str:
    """What one CPU 'device' holds: this machine's memory shared by the ranks that train on it at once (the planner
    fits each rank's tensors in it), or unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // world
    except (ValueError, OSError, AttributeError):
        return "unknown"


def _measure_quietly(job: Job) -> dict:
    """One process's figures with its library and profiler output silenced: calibrate's output is its own lines."""
    from ..trace.ranks import quiet_output

    with quiet_output():
        return measure_rank(job, 0, 1)


def calibrate(job: Job | None, nproc: int, out_path, gpu_only: bool = False) -> dict:
    """Measure on nproc gloo ranks at once and write the profile YAML; returns the profile. On a host with a GPU
    the profile gains that GPU's row, measured on it (toolkit.calibrate.device); `gpu_only` measures that alone
    (the CPU figures at a large job's shapes take long on CPU cores)."""
    from ..trace.ranks import trace_on_ranks

    if gpu_only and not torch.cuda.device_count():
        raise SpecError("--gpu-only", True, "needs a CUDA GPU on this host; leave it out to calibrate the CPU cores")
    job = job or Job()
    rows = []
    if not gpu_only:
        measured = (
            trace_on_ranks(
                measure_rank, job, nproc, "calibration", "rank", "measure on fewer ranks", result=dict, quiet=True
            )
            if nproc > 1
            else [_measure_quietly(job)]
        )
        rows = profile_row(measured, nproc)["accelerators"]
    if torch.cuda.device_count():
        try:
            rows.append(_gpu_row(job, out_path))
        except (RuntimeError, SpecError) as err:  # (the CPU row measured above is still written)
            if gpu_only:
                raise SpecError("", None, f"the GPU was not measured: {err}") from err
            print(f"the GPU was not measured: {err}", file=sys.stderr)
    profile = {"accelerators": rows}
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(f"# {rows[0]['source']}\n")
        yaml.safe_dump(profile, f, sort_keys=False)
    return profile


def _gpu_row(job: Job, out_path) -> dict:
    """This host's GPU row, measured on it (toolkit.calibrate.device); probe runs are kept beside the profile.
    RuntimeError or SpecError says why not (no job to probe, a probe refused or failed)."""
    from pathlib import Path

    from ..specs import load_catalog
    from .device import gpu_row

    if not job.model.has_shape:
        raise RuntimeError("give --config JOB.yaml (the probe trains the job's blocks on the GPU)")
    return gpu_row(job, load_catalog(), Path(out_path).with_name(Path(out_path).stem + "-device-probe"))
