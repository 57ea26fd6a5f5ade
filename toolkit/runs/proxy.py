"""What Run starts on this machine: the job itself when the machine holds it, else a scaled-down proxy.

    plan = run_plan(job)            # RunPlan: .job, .nproc, .proxy, .kept, .changes, .refusal
    print(plan.text())              # plain words, shown before anyone presses Run

A proxy keeps what the job is made of (the kinds of parallelism, the pipeline schedule and virtual stages,
the ZeRO stage and offload, precision, recompute, optimizer and techniques) and shrinks what only makes it
big: the model (a few layers of width 128), the devices (at most four ranks: gloo processes on a CPU), the
batch and the number of steps. Everything it changed is listed, so nobody mistakes its numbers for the
full job's. No torch here: the planner panel asks on every redraw.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from ..capability import run_refusal
from ..specs import Job, SpecError
from ..specs.axes import AXES, AXIS

__all__ = ["LocalDevices", "RunPlan", "local_devices", "run_plan"]

PROXY_MODEL = {"hidden": 128, "heads": 4, "vocab": 256, "seq_len": 128, "min_layers": 4}
"""The proxy model: 32-wide heads, a byte-sized vocabulary and 128 tokens train in seconds on a CPU core."""
CPU_SLOW_AUTOCAST = ("amp-bf16", "amp-fp16")
"""Autocast modes a CPU proxy runs in fp32 instead: the program is the same but for the matmuls' dtype, and 16-bit
autocast on a CPU runs 20-30x slower than fp32 (the README's train example: 124 against 2,370 tokens/s)."""
PROXY_TRAINING = {"steps": 30, "warmup_steps": 3, "lr": 2e-3, "eval_every": 10, "checkpoint_every": 10}


@dataclasses.dataclass(frozen=True)
class LocalDevices:
    kind: str  # "cuda" or "cpu"
    count: int  # GPUs, or CPU cores
    memory_bytes: float | None = None  # per GPU
    name: str = "CPU"


@dataclasses.dataclass(frozen=True)
class RunPlan:
    job: Job | None  # what Run trains (None when nothing can run)
    nproc: int
    proxy: bool
    kept: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    refusal: str | None = None
    unfit: str | None = None
    """Why the job as planned fits none of its own devices (its estimate), or None: a proxy then shows the program
    running, not this job."""

    def lines(self) -> list[str]:
        """What Run starts, in plain words: a headline, then (for a proxy) what was kept and what was scaled."""
        if self.job is None:
            return [f"Run: not available here. {self.refusal}"]
        if not self.proxy:
            return [f"Run: the job itself, on {self.nproc} rank(s) of this machine."]
        if self.unfit:
            head = (
                f"Run: the job as planned does not fit its devices ({self.unfit}), so it cannot run anywhere as it "
                f"stands; Run trains a proxy of it on {self.nproc} rank(s), which shows its program running, not "
                "this job's memory or speed."
            )
        else:
            head = f"Run: this machine cannot hold the job ({self.refusal}), so Run trains a proxy on {self.nproc} rank(s)."
        return [
            head,
            f"Kept: {', '.join(self.kept)}.",
            f"Scaled: {'; '.join(self.changes)}.",
        ]

    def text(self) -> str:
        return " ".join(self.lines())

    def with_steps(self, steps: int) -> RunPlan:
        """The same proxy trained for `steps` steps (the job itself keeps its own)."""
        if self.job is None or not self.proxy:
            return self
        job = self.job.replace(training=dataclasses.replace(self.job.training, steps=steps))
        return dataclasses.replace(self, job=job, changes=(*self.changes[:-1], _steps_change(steps)))


def local_devices() -> LocalDevices:
    """The GPUs nvidia-smi lists (name, count, memory), or this machine's CPU cores when there are none."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            rows = [line.split(",") for line in out.strip().splitlines() if line.strip()]
            if rows:
                return LocalDevices("cuda", len(rows), float(rows[0][1]) * 2**20, rows[0][0].strip())
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    return LocalDevices("cpu", os.cpu_count() or 1)


def run_plan(
    job: Job,
    here: LocalDevices | None = None,
    max_ranks: int = 4,
    device_peak_bytes: float | None = None,
    unfit: str | None = None,
) -> RunPlan:
    """The job itself when this machine's GPUs hold it (enough of them, enough memory, a layout the runner runs);
    otherwise a proxy of at most `max_ranks` ranks. `job` is resolved here (the planner's job need not be);
    `device_peak_bytes`, where the caller has estimated it already, spares estimating it again; `unfit` says why
    the job fits none of its own devices, where its estimate says so (the plan then says the proxy is all that
    can run)."""
    here = here or local_devices()
    try:
        full, _ = job.resolve()
    except SpecError as err:
        return RunPlan(None, 0, False, refusal=f"The job is not valid: {err}")
    refusal = run_refusal(full)
    why = _why_not_here(full, here, device_peak_bytes)
    if why is None and refusal is None:
        return RunPlan(full, full.devices, False)
    plan = _proxy(full, here, max_ranks, why or f"the runner does not train it as planned: {refusal[2]}")
    return dataclasses.replace(plan, unfit=unfit) if plan.job is not None and unfit else plan


def _why_not_here(job: Job, here: LocalDevices, need: float | None) -> str | None:
    if here.kind != "cuda":
        return f"no GPU here; the job needs {job.devices} × {job.cluster.accelerator or 'GPU'}"
    if here.count < job.devices:
        return f"{here.count} GPU(s) here; the job needs {job.devices}"
    if need is None:
        from ..estimate import estimate_result

        memory = estimate_result(job).memory
        need = memory.device_peak_bytes or memory.peak_bytes
    if here.memory_bytes is not None and need > here.memory_bytes:
        return f"it needs {need / 2**30:.1f} GiB per device; the {here.name} has {here.memory_bytes / 2**30:.1f} GiB"
    return None


def _layout(par, max_ranks: int) -> tuple[int, int, int, int]:
    """(dp, tp, pp, vpp) of the proxy: each kind of parallelism the job uses, at degree 2 (the axes' proxy_max,
    toolkit.specs.axes), within max_ranks; data parallelism goes first, then the pipeline, then tensor parallelism."""
    tp, pp = min(par.tp, AXIS["tp"].proxy_max), min(par.pp, AXIS["pp"].proxy_max)
    vpp = min(par.vpp, AXIS["vpp"].proxy_max) if par.pp > 1 else 1
    dp = 2 if par.dp > 1 else 1
    while dp * tp * pp > max_ranks:
        if dp > 1:
            dp = 1
        elif pp > 1:
            pp, vpp = 1, 1
        else:
            tp = 1
    return dp, tp, pp, vpp


def _proxy(job: Job, here: LocalDevices, max_ranks: int, why: str) -> RunPlan:
    ranks = max(1, min(max_ranks, here.count if here.kind == "cuda" else max_ranks))
    par = job.parallel
    dp, tp, pp, vpp = _layout(par, ranks)
    model = job.model
    layers = max(PROXY_MODEL["min_layers"], 2 * pp * vpp)
    heads = PROXY_MODEL["heads"]
    kv_heads = heads if model.kv_heads_ == model.heads else max(tp, heads * model.kv_heads_ // model.heads)
    micro = min(job.batch.micro_batch, AXIS["micro_batch"].proxy_max)
    rounds = min(job.grad_accum or 1, 4)
    if pp > 1:
        rounds = max(rounds, pp) // pp * pp  # at least one micro-batch per stage, whole rounds of pp
    mode, mode_note = job.precision.mode, None
    if job.backend == "megatron":
        mode, mode_note = (
            "amp-bf16",
            (
                f"precision {job.precision.mode} → amp-bf16 (with tp or pp, {job.precision.mode} "
                "is Megatron's program, estimated only; torch's program trains amp-bf16)"
            ),
        )
    elif here.kind != "cuda" and job.backend == "deepspeed" and mode == "mixed-fp16":
        mode, mode_note = "mixed-bf16", "precision mixed-fp16 → mixed-bf16 (DeepSpeed runs fp16 on GPUs only)"
    elif here.kind != "cuda" and mode in (None, *CPU_SLOW_AUTOCAST):
        mode, mode_note = (
            "fp32",
            (
                f"precision {mode or 'amp-bf16'} → fp32 (autocast only changes the matmuls' dtype, and a CPU's 16-bit "
                "autocast runs 20-30x slower: the proxy would take minutes a step)"
            ),
        )
    data = job.to_dict()
    data["model"] = {
        **data["model"],
        "name": f"proxy of {model.name or 'the model'}",
        "layers": layers,
        "hidden": PROXY_MODEL["hidden"],
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": None,
        "ffn": None,
        "vocab": PROXY_MODEL["vocab"],
        "seq_len": PROXY_MODEL["seq_len"],
        "max_positions": None,
        "dropout": 0.0,
        "params": None,
    }
    data["batch"] = {"micro_batch": micro, "global_batch": micro * dp * rounds}
    data["precision"] = {**data["precision"], "mode": mode}
    data["parallel"] = {
        **data["parallel"],
        **_other_axes(par, dp),
        "backend": None if mode_note else par.backend,
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "vpp": vpp,
        "stage_layers": None,
        "partition": None,
        "sp": par.sp and tp > 1,
    }
    data["cluster"] = {
        **data["cluster"],
        "count": dp * tp * pp,
        "accelerator": data["cluster"]["accelerator"] if here.kind == "cuda" else None,
    }
    data["memory"] = {**data["memory"], "program": None}
    data["cost"] = {**data["cost"], "offer": None}
    data["training"] = {**data["training"], **PROXY_TRAINING, "init_from": None, "data": None}
    data["tokens"], data["mfu"] = None, None
    try:
        proxy, _ = Job.from_dict(data).resolve()
    except SpecError as err:
        return RunPlan(None, 0, False, refusal=f"No proxy of this job could be built ({err}).")
    refusal = run_refusal(proxy)
    if refusal is not None:
        return RunPlan(None, 0, False, refusal=f"The proxy would need what the runner does not train: {refusal[2]}.")
    return RunPlan(
        proxy, proxy.devices, True, kept=_kept(proxy), refusal=why, changes=_changes(job, proxy, here, mode_note)
    )


def _other_axes(par, dp: int) -> dict:
    """The parallel axes _layout leaves, each at most its proxy_max (cp: none; HSDP copies that divide dp)."""
    out = {}
    for axis in AXES:
        if axis.section == "parallel" and axis.proxy_max is not None and axis.name not in ("tp", "pp", "vpp"):
            out[axis.name] = min(getattr(par, axis.name), axis.proxy_max)
    if dp % out["dp_replicate"]:
        out["dp_replicate"] = 1
    return out


def _kept(proxy: Job) -> tuple[str, ...]:
    par = proxy.parallel
    kinds = [f"{name} {degree}" for name, degree in (("dp", par.dp), ("tp", par.tp), ("pp", par.pp)) if degree > 1]
    kept = [" × ".join(kinds) or "one rank"]
    if par.sp:
        kept.append("sequence parallel")
    if par.pp > 1:
        kept.append(
            f"{'interleaved ' if par.vpp > 1 else ''}{par.schedule} schedule"
            + (f", {par.vpp} virtual stages" if par.vpp > 1 else "")
        )
    if par.zero or par.offload != "none":
        kept.append(f"ZeRO-{par.zero}" + (f" + offload {par.offload}" if par.offload != "none" else ""))
    kept += [
        proxy.precision.mode + (" (DeepSpeed)" if proxy.backend == "deepspeed" else ""),
        f"recompute {proxy.memory.recompute}",
        proxy.optimizer.name,
    ]
    if proxy.finetune.method != "full":
        kept.append(f"{proxy.finetune.method} rank {proxy.finetune.rank}")
    if proxy.memory.act_compress != "none":
        kept.append(f"{proxy.memory.act_compress} activations")
    return tuple(kept)


def _changes(job: Job, proxy: Job, here: LocalDevices, mode_note: str | None) -> tuple[str, ...]:
    m, p = job.model, proxy.model
    where = f"{proxy.devices} CPU process(es) over gloo" if here.kind != "cuda" else f"{proxy.devices} × {here.name}"
    changes = [
        f"model {m.name or 'custom'} ({m.layers} layers, hidden {m.hidden}, {m.heads} heads, vocab {m.vocab}, "
        f"{m.seq_len} tokens) → {p.layers} layers, hidden {p.hidden}, {p.heads} heads"
        + (f" ({p.kv_heads_} KV)" if p.kv_heads_ != p.heads else "")
        + f", vocab {p.vocab}, {p.seq_len} tokens",
        f"devices {job.devices} × {job.cluster.accelerator or 'GPU'} → {where}",
    ]
    pj, pp_ = job.parallel, proxy.parallel
    scaled = [axis.name for axis in AXES if axis.section == "parallel" and axis.proxy_max is not None]
    for name in ("dp", *scaled):
        if getattr(pj, name) != getattr(pp_, name):
            changes.append(f"{name} {getattr(pj, name)} → {getattr(pp_, name)}")
    changes.append(
        f"batch {job.batch.global_batch} sequences (micro-batch {job.batch.micro_batch}, "
        f"{job.grad_accum} accumulation steps) → {proxy.batch.global_batch} (micro-batch "
        f"{proxy.batch.micro_batch}, {proxy.grad_accum})"
    )
    if mode_note:
        changes.append(mode_note)
    changes.append(_steps_change(proxy.training.steps))
    return tuple(changes)


def _steps_change(steps: int) -> str:
    return f"{steps} steps on the demo corpus, from random weights"
