"""This host's GPU, measured: what it holds beyond the program's tensors (the figures toolkit.estimate.device
otherwise assumes: the CUDA context with the kernels a training step loads, the cuBLAS workspaces torch's
allocator hands out, and the share of the caching allocator's pool that holds no live tensor at the peak, with
and without expandable segments), and how fast it runs the job's kernels (the step-time model's assumptions).

They are read from the runner's own program: one process trains a few steps of one tensor-parallel rank's share
of the job's blocks on the first GPU (the job's width, sequence, micro-batch, precision, recompute and optimizer; as
many of its layers as the estimate puts within half the device; no parallelism, so no NCCL communicator is
counted), once per allocator setting and each in a fresh process, since torch reads PYTORCH_CUDA_ALLOC_CONF once
and a context only grows. `toolkit
calibrate` writes them into the catalog row of this GPU (`device_memory`, `assumptions`), so `--catalog
profile.yaml` predicts this machine's reserved and nvidia-smi peaks and its step time. What runs on the host
between kernels (per-op and checkpoint costs) stays 0 as for catalog rows: a GPU's asynchronous launches hide it
at training sizes; collectives are not measured (one GPU's process, no NCCL).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

from ..specs import Job
from ..specs.catalog import DTYPES, Catalog

__all__ = ["gpu_row", "catalog_row_for", "probe_job", "device_memory_terms"]

PROBE_STEPS = 4
"""Steps of a probe run: the runner records the allocator's peaks over steps 2 and 3 (optimizer states exist)."""
PROBE_SHARE = 0.5
"""Of the device's memory, what the probe's estimated device peak may fill (fragmentation is read below it)."""


def gpu_row(job: Job, catalog: Catalog, out_dir: str | Path) -> dict:
    """The catalog row of this host's first GPU as measured here: its `device_memory`, and its kernels' rates as
    the step-time model's assumptions (`gemm_fraction` and `attention_fraction` of the datasheet's peak,
    `gemm_half_size`, the optimizer's rate) with the element-wise bandwidth as its memory bandwidth. Merged over the
    catalog's row of the same GPU (its other figures kept, its source extended), or a row of its own (capacity
    measured, the matmul rate as its peak) when the catalog does not know it. Probe runs are kept under OUT_DIR."""
    import torch

    props = torch.cuda.get_device_properties(0)
    name = catalog_row_for(props.name, props.total_memory, catalog)
    probe = probe_job(job.replace(cluster=dataclasses.replace(job.cluster, accelerator=name)), props.total_memory)
    terms = device_memory_terms(probe, out_dir)
    kernels = _in_fresh_process("_kernel_figures", probe.to_dict())
    host, today = platform.node() or "this-host", datetime.date.today().isoformat()
    how = (
        f"measured on {host} ({props.name}), {today} by toolkit calibrate: device_memory from {PROBE_STEPS} steps "
        f"of {probe.model.layers} layers of one tensor-parallel rank's share of the job in one process, under "
        f"torch's default allocator and expandable segments; the job's {kernels['dtype']} products, attention, "
        "element-wise kernels and optimizer timed on the device"
    )
    base = catalog.accelerator(name) if name else None
    peak = base.peak_flops(kernels["dtype"]) if base else None
    row = (
        {"name": base.name, "source": f"{base.source} (as of {base.as_of}); {how}"}
        if base
        else {
            "name": re.sub(r"[^A-Za-z0-9]+", "-", props.name).strip("-"),
            "vendor": props.name.split()[0],
            "memory_bytes": int(props.total_memory),
            "link_bw_bytes_per_s": "unknown",
            "tdp_w": "unknown",
            "source": how,
        }
    )
    if peak is None:  # (the catalog gives no peak for this dtype: the measured rate stands for it)
        peak = kernels["matmul_flops"]
        known = {d: "n/a" if d in base.unsupported else v for d, v in base.peak_tflops.items()} if base else {}
        row["peak_tflops"] = {d: "unknown" if known.get(d) is None else known[d] for d in DTYPES}
        row["peak_tflops"][kernels["dtype"]] = peak / 1e12
    row.update(
        {
            "memory_bw_bytes_per_s": kernels["memory_bw_bytes_per_s"],
            "device_memory": terms,
            "as_of": today,
            "assumptions": {
                "gemm_fraction": kernels["matmul_flops"] / peak,
                "gemm_half_size": kernels["gemm_half_size"],
                "attention_fraction": kernels["attention_flops"] / peak,
                "optimizer_params_per_s": kernels["optimizer_params_per_s"],
            },
        }
    )
    return row


def _model_part(row_name: str) -> str:
    """A row name's model: its first part where that holds a number ("a100", "l4"), else its first two ("rtx4090",
    not "rtx", which every RTX card's name holds)."""
    parts = [re.sub(r"[^a-z0-9]", "", p) for p in row_name.lower().split("-")]
    model = parts[0] if any(c.isdigit() for c in parts[0]) else "".join(parts[:2])
    return model if any(c.isdigit() for c in model) else ""


def catalog_row_for(device_name: str, total_bytes: float, catalog: Catalog) -> str | None:
    """The catalog accelerator a GPU is, from its name as torch or nvidia-smi gives it ("NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-40GB"): the rows whose model (a name's or alias's first part, e.g. "a100") the name contains,
    the one whose capacity is nearest the device's; None when no row names its model, or the name says PCIe and
    no such row does (a PCIe card is not its SXM sibling: lower clocks and power)."""
    name = re.sub(r"[^a-z0-9]", "", device_name.lower())
    candidates = []
    for acc in catalog.accelerators.values():
        models = {_model_part(n) for n in (acc.name, *acc.aliases)}
        if any(len(m) >= 2 and m in name for m in models) and acc.memory_bytes:
            candidates.append(acc)
    if "pcie" in name:
        candidates = [a for a in candidates if any("pcie" in n.lower() for n in (a.name, *a.aliases))]
    if not candidates:
        return None
    return min(candidates, key=lambda a: abs(a.memory_bytes - total_bytes)).name


def probe_job(job: Job, capacity_bytes: float) -> Job:
    """One rank's share of the job on one device, a few steps long: its blocks as a tensor-parallel rank holds them
    (heads, MLP width and vocabulary over tp: toolkit.calibrate.kernels.rank_spec), its micro-batch, precision,
    recompute and optimizer; as many of its layers as keep the estimated device peak within PROBE_SHARE of
    `capacity_bytes` (at least one); parallelism, ZeRO and offload off, no checkpoints or evaluation."""
    from ..estimate import estimate_result
    from .kernels import rank_spec

    data = job.replace(model=dataclasses.replace(rank_spec(job), layers=job.model.layers)).to_dict()
    data["parallel"] = {"dp": 1, "tp": 1, "pp": 1}
    data["cluster"] = {**data["cluster"], "count": 1}
    data["batch"] = {"micro_batch": job.batch.micro_batch, "global_batch": job.batch.micro_batch}
    data["cost"] = {**data["cost"], "offer": None}
    data["tokens"], data["mfu"] = None, None
    data["training"] = {
        **data["training"],
        "steps": PROBE_STEPS,
        "warmup_steps": 1,
        "eval_every": 0,
        "checkpoint_every": 0,
        "init_from": None,
    }
    data["model"] = {**data["model"], "params": None}
    data["memory"] = {**data["memory"], "program": None}
    best = None
    for layers in range(1, job.model.layers + 1):
        data["model"]["layers"] = layers
        probe, _ = Job.from_dict(data).resolve()
        memory = estimate_result(probe).memory
        if best is not None and (memory.device_peak_bytes or memory.peak_bytes) > PROBE_SHARE * capacity_bytes:
            break
        best = probe
    return best


def device_memory_terms(probe: Job, out_dir: str | Path) -> dict:
    """{context_bytes, workspace_bytes, fragmentation, fragmentation_expandable} of the first GPU, read from runs
    of `probe` (a `probe_job`) under OUT_DIR (see the module's docstring)."""
    import torch

    free, total = torch.cuda.mem_get_info(0)
    others = total - free  # already on the device: other processes and this one's own context
    peaks = {}
    for expandable in (False, True):
        run = Path(out_dir) / ("expandable" if expandable else "default")
        setting = dataclasses.replace(probe.memory, expandable_segments=expandable)
        peaks[expandable] = _probe_peaks(probe.replace(memory=setting), run)
    plain = peaks[False]
    return {
        "context_bytes": int(max(plain["device_peak_bytes"] - plain["reserved_peak_bytes"] - others, 0)),
        "workspace_bytes": _in_fresh_process("_workspace_bytes", probe.to_dict()),
        "fragmentation": 1 - plain["peak_bytes"] / plain["reserved_peak_bytes"],
        "fragmentation_expandable": 1 - peaks[True]["peak_bytes"] / peaks[True]["reserved_peak_bytes"],
    }


def _probe_peaks(probe: Job, run: Path) -> dict:
    """Train the probe in a fresh process and return the CUDA peaks its run recorded."""
    record = _in_fresh_process("_probe_run", probe.to_dict(), str(run))
    if record.get("instrument") != "torch.cuda allocator":
        raise RuntimeError(f"the device-memory probe ran on {record.get('instrument')}, not a GPU (its run: {run})")
    return record


def _probe_run(job_dict: dict, out: str) -> dict:
    """In a fresh process: the runner's Trainer through the probe's steps, as `toolkit train` runs one rank but
    without the final checkpoint (a 176B job's share would write tens of GB); the run's memory record."""
    import os

    from ..launch.determinism import pinned, rank_threads
    from ..runs.folder import read_rank_memory
    from ..train.launch import prepare_run
    from ..train.loop import Trainer

    job = prepare_run(Job.from_dict(job_dict), out, 1, force=True)  # (the probe sizes itself)
    kept = [o for o in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if o and "expandable_segments" not in o]
    expandable = ["expandable_segments:True"] if job.memory.expandable_segments else []
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(kept + expandable)
    # (read at CUDA's first allocation; a user's own expandable setting would blur the two probes)
    with pinned(rank_threads(1), "cuda"):
        Trainer(job, out, rank_threads(1), progress=False).fit(checkpoints=False)
    return read_rank_memory(out)[0]


def _in_fresh_process(function: str, *args):
    """This module's `function(*args)` in a new interpreter (a CUDA context of its own); its JSON result."""
    code = (
        f"import json, sys; from toolkit.calibrate.device import {function}; "
        f"print(json.dumps({function}(*json.loads(sys.argv[1]))))"
    )
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{function} failed in its own process: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _workspace_bytes(job_dict: dict) -> int:
    """In a fresh process: what stays allocated after one of the job's products runs forward and backward as
    training runs it (autocast included) and every tensor it made is freed: the cuBLAS workspaces of the main
    thread's handle and of autograd's backward thread."""
    import torch

    from ..program.precision import torch_precision
    from .kernels import job_shapes

    job, _ = Job.from_dict(job_dict).resolve()
    plan = torch_precision(job.precision.mode or "fp32")
    m, k, n = max(job_shapes(job), key=lambda s: s[0] * s[1] * s[2])
    device = torch.device("cuda", 0)
    layer = torch.nn.Linear(k, n, bias=False, device=device, dtype=plan.param_dtype)
    x = torch.randn(m, k, device=device, dtype=plan.param_dtype, requires_grad=True)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    with plan.autocast("cuda"):
        y = layer(x)
    y.float().sum().backward()
    del y
    x.grad, layer.weight.grad = None, None
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device) - before)


def _kernel_figures(job_dict: dict, device: str = "cuda") -> dict:
    """In a fresh process: the probe's products (its own, and with their rows halved and doubled) timed on the GPU
    and fitted to a large-matrix rate and `gemm_half_size`; its fused attention's rate, its block's element-wise
    bandwidth (bytes counted as the step-time model counts them) and its optimizer's rate, in its compute dtype."""
    from ..program.precision import TORCH_DTYPES
    from ..specs.job import compute_dtype
    from .kernels import (
        attention_flops,
        elementwise_bw_bytes_per_s,
        half_size,
        job_shapes,
        matmul_flops,
        optimizer_params_per_s,
        thin_shapes,
    )

    job, _ = Job.from_dict(job_dict).resolve()
    dtype_name = compute_dtype(job.precision.mode or "fp32")
    dtype = TORCH_DTYPES[dtype_name]
    shapes = job_shapes(job)
    timed = thin_shapes(shapes) + shapes
    rate, half = half_size(timed, matmul_flops(timed, dtype, rounds=2, device=device))
    return {
        "dtype": dtype_name,
        "matmul_flops": rate,
        "gemm_half_size": half,
        "attention_flops": attention_flops(job, dtype, device=device),
        "memory_bw_bytes_per_s": elementwise_bw_bytes_per_s(job, dtype, device=device),
        # (one block: its rate per parameter is the model's, and the probe's layers would not fit twice over)
        "optimizer_params_per_s": optimizer_params_per_s(
            job.replace(model=dataclasses.replace(job.model, layers=1)), device=device
        ),
    }
