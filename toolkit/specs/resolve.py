"""Checks between fields of a Job, and the defaults that depend on other fields.

Each rule raises a SpecError naming the field, its value and what would be valid. The
order follows the Job: sizes, cluster and offer, parallel layout, precision, fine-tuning, batch, budget, the
runner's section; one function per section. The layout rules themselves are toolkit.specs.rules, which the
planner's layout grid applies to arrays of layouts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .axes import model_parallel
from .backends import deepspeed_fp32, infer_backend
from .catalog import Catalog
from .errors import SpecError
from .fields import check_positive, check_range
from .precision import TORCH_SEMANTICS, compute_dtype
from .resolve_checks import check_finetune, check_sizes
from .resolve_layout import check_interleaved_rounds, divisors, resolve_layout
from .rules import (
    batch_split,
    named_backend_fits,
    optimizer_offload_fits,
    params_offload_fits,
    per_op_recompute_fits,
)
from .serving import resolve_serving

Job = Any
"""A toolkit.specs.job.Job, which calls this module (Job.resolve -> resolve_job): named here, not imported, so that
the dependency runs one way, job -> resolve."""

__all__ = ["resolve_job", "divisors"]


def _resolve_training(job: Job, notes: list[str]):
    """Check the runner's section; returns the memory options with `gradient_checkpointing` applied."""
    t, memory = job.training, job.memory
    for name in ("steps", "lr", "eval_batches", "keep_checkpoints", "prefetch", "bucket_cap_mb", "loss_scale"):
        check_positive(getattr(t, name), f"training.{name}")
    for name in ("warmup_steps", "weight_decay", "grad_clip", "num_workers", "eval_every", "checkpoint_every"):
        check_positive(getattr(t, name), f"training.{name}", allow_zero=True)
    check_range(t.min_lr_fraction, "training.min_lr_fraction", 0.0, 1.0)
    if t.warmup_steps >= t.steps and t.steps > 1:
        default = t.warmup_steps == type(t)().warmup_steps
        raise SpecError(
            "training.warmup_steps",
            t.warmup_steps,
            ("(the default) " if default else "") + f"must be below training.steps = {t.steps}; "
            f"give --warmup {max(t.steps // 10, 1)}" + (" or more --steps" if default else ""),
        )
    if t.compile:
        notes.append(
            "training.compile: the step prices the element-wise kernels fused, as inductor compiles a block; the "
            "memory is the eager program's (a compiled block may save fewer activations)"
        )
    pruning = t.pruning
    if pruning.method == "magnitude":
        check_range(pruning.sparsity, "training.pruning.sparsity", 0.0, 1.0, high_open=True)
    check_positive(pruning.at_step, "training.pruning.at_step", allow_zero=True)
    if pruning.method != "none" and pruning.at_step >= t.steps:
        raise SpecError(
            "training.pruning.at_step",
            pruning.at_step,
            f"must be below training.steps = {t.steps}, or the masks never act",
        )
    if pruning.method == "2:4" and pruning.sparsity != 0.5:
        notes.append("2:4 pruning zeroes exactly half the block weights; training.pruning.sparsity ignored")
    if t.gradient_checkpointing is not None:
        wanted = "full" if t.gradient_checkpointing else "none"
        if memory.recompute not in ("none", wanted):
            raise SpecError(
                "training.gradient_checkpointing",
                t.gradient_checkpointing,
                f"contradicts memory.recompute = {memory.recompute}; keep one of the two",
            )
        memory = dataclasses.replace(memory, recompute=wanted if t.gradient_checkpointing else memory.recompute)
    for tracker in t.trackers:
        if tracker not in ("tensorboard", "wandb", "trackio"):
            raise SpecError("training.trackers", tracker, "allowed: tensorboard, wandb, trackio")
    if t.fp32_norm and job.precision.mode in ("fp32", "amp-bf16", "amp-fp16"):
        notes.append(
            f"training.fp32_norm changes nothing under {job.precision.mode}: norms already run in fp32 "
            "on the fp32 residual stream; it matters for mixed-* and pure-bf16"
        )
    return memory


_BACKEND_PROGRAMS = {
    "torch": "torch's program (DDP, FSDP2, DTensor, pipelining) runs fp32, amp-* and pure-bf16, and mixed-* as "
    "replicas without ZeRO, tp or pp",
    "deepspeed": "DeepSpeed's program is modelled for the mixed-* modes and fp32 with zero 1, 2 or 3 over dp alone "
    "(16-bit or fp32 weights, fp32 master partitions), and for mixed-* with tp or pp at zero 0 or 1 "
    "(Megatron-DeepSpeed: its engine and pipeline around Megatron's tensor parallelism)",
    "megatron": "Megatron's program is modelled for the mixed-* modes with tp or pp (ZeRO-1 as its distributed "
    "optimizer)",
}


def _check_backend(par, mode: str) -> None:
    """A named parallel.backend must be the one the layout is modelled with (Job.backend infers it when unset): the
    estimate models each framework for its own layouts, so another would make the numbers describe another program.
    (Left as given, not filled in: jobs derived from this one with another layout infer theirs afresh.)"""
    if not named_backend_fits(par.backend, mode, par.zero, par.tp, par.pp):
        inferred = infer_backend(mode, par.zero, par.tp, par.pp)
        raise SpecError(
            "parallel.backend",
            par.backend,
            f"{_BACKEND_PROGRAMS[par.backend]}; precision.mode = {mode} with zero {par.zero}, tp {par.tp}, "
            f"pp {par.pp} is {inferred}'s (leave backend unset, or change the mode or layout)",
        )


def _model_notes(model, par, notes: list[str]) -> None:
    """What the estimate assumes of a Mixture of Experts and of latent attention, said once."""
    if model.experts:
        routing = "sigmoid with a balancing bias" if model.router == "sigmoid" else "softmax with a balancing loss"
        load = (
            f"expert_imbalance {model.expert_imbalance:g} (given)"
            if model.expert_imbalance is not None
            else f"the busiest expert takes {1.04 if model.router == 'sigmoid' else 1.52:g}× the mean ({routing}: Wang "
            "et al. 2024, arXiv 2408.15664, Table 2; set model.expert_imbalance)"
        )
        capacity = "dropless" if model.capacity_factor is None else f"capacity factor {model.capacity_factor:g}"
        notes.append(
            f"Mixture of Experts: {model.experts} experts, top-{model.experts_per_token}, {capacity}; ep {par.ep} keeps "
            f"{model.experts // par.ep} per rank; {load}; all-to-alls not overlapped"
        )
    if model.attention_kind == "mla":
        notes.append(
            "latent attention (MLA): priced by its low-rank projections and a standard core that keeps as much; the "
            "runner does not run it, so this is modelled, not traced"
        )


def resolve_job(job: Job, catalog: Catalog) -> tuple[Job, list[str]]:
    notes: list[str] = []
    job.model.validate()
    if job.workload == "inference":
        return _resolve_inference(job, catalog, notes)
    check_sizes(job)
    cluster, accelerator = _resolve_cluster(job, catalog, notes)
    par = resolve_layout(job, cluster, notes)
    _model_notes(job.model, par, notes)
    precision = _resolve_precision(job, accelerator, notes)
    _check_sharding(job, par, precision.mode, notes)
    check_finetune(job, precision.mode)
    workload = job.workload or ("finetune" if job.finetune.adapters else "train")
    batch, preset = _resolve_batch(job, par, catalog, notes, workload)
    tokens = _token_budget(job, workload, preset, notes)
    memory = _resolve_training(job, notes)
    if memory.program is None:
        memory = dataclasses.replace(memory, program="cpu" if accelerator is None else "cuda")
    resolved = dataclasses.replace(
        job,
        memory=memory,
        parallel=par,
        cluster=cluster,
        batch=batch,
        tokens=tokens,
        precision=precision,
        workload=workload,
    )
    return resolved, notes


def _resolve_inference(job: Job, catalog: Catalog, notes: list[str]) -> tuple[Job, list[str]]:
    """A serving job: its cluster, a layout of tp × pp per replica (dp: replicas, each serving alone), the compute
    dtype, and the serving section's defaults. Training's sections (batch, optimizer, budget) do not apply."""
    par = job.parallel
    for name, value in (("zero", par.zero), ("cp", par.cp), ("etp", par.etp)):
        if value not in (None, 0, 1):
            raise SpecError(
                f"parallel.{name}",
                value,
                "is a training layout; serving is modelled with tp, pp, ep and replicas (dp) only",
            )
    if par.ep > 1 and par.ep % par.tp:
        raise SpecError(
            "parallel.ep",
            par.ep,
            f"serving spreads experts over whole tensor-parallel groups (attention data parallel, as vLLM's "
            f"--enable-expert-parallel and SGLang's --ep-size): use ep a multiple of tp = {par.tp}",
        )
    if job.model.encoder:
        raise SpecError("model", job.model.name, "is an encoder: serving models decoders that generate tokens")
    cluster, accelerator = _resolve_cluster(job, catalog, notes)
    par = resolve_layout(job, cluster, notes)
    _model_notes(job.model, par, notes)
    precision = _resolve_precision(job, accelerator, notes)
    compute = compute_dtype(precision.mode)
    serving = resolve_serving(
        job.serving, compute, job.model.seq_len if job.model.has_shape else None, notes, device=accelerator
    )
    resolved = dataclasses.replace(
        job, parallel=par, cluster=cluster, precision=precision, serving=serving, workload="inference"
    )
    return resolved, notes


def _token_budget(job: Job, workload: str, preset, notes: list[str]) -> float | None:
    """The token budget: the job's; for a fine-tune its data's (dataset_tokens × epochs), never the preset's
    pretraining budget; for pretraining the preset's published one."""
    ft = job.finetune
    check_positive(ft.dataset_tokens, "finetune.dataset_tokens")
    check_positive(ft.epochs, "finetune.epochs")
    if job.tokens is not None:
        return job.tokens
    if workload == "finetune":
        if ft.dataset_tokens is not None:
            notes.append(
                f"tokens = {ft.dataset_tokens * ft.epochs:.4g}, the fine-tuning data "
                f"({ft.dataset_tokens:.4g} tokens × {ft.epochs:g} epochs)"
            )
            return ft.dataset_tokens * ft.epochs
        notes.append(
            "fine-tuning budget not given (--tokens, or --dataset-tokens and --epochs): time is shown per "
            "billion tokens, not the pretraining budget"
        )
        return None
    if preset is not None and preset.tokens is not None:
        notes.append(f"tokens = {preset.tokens:.4g}, the budget published for {preset.name}")
        return preset.tokens
    return None


def _nvlink_domain(cluster, accelerator, notes: list[str]):
    """A rack-scale NVLink domain (NVL72) in place of the default 8 GPUs a node: the largest power of two up to the
    domain that divides the devices (256 GB200 as 4 racks of 64), said in a note; a job's own gpus_per_node stays."""
    domain = accelerator.nvlink_domain if accelerator is not None else None
    if not domain or cluster.gpus_per_node != 8 or cluster.count is None or cluster.count <= 8:
        return cluster
    if cluster.count <= domain:
        size = cluster.count
    else:
        size = next((s for s in (64, 32, 16) if s <= domain and cluster.count % s == 0), 8)
    if size == 8:
        return cluster
    notes.append(
        f"{accelerator.name}: one NVLink domain spans {domain} GPUs; {size} GPUs a domain here "
        f"(cluster.gpus_per_node = {size}; give --gpus-per-node to set it)"
    )
    return dataclasses.replace(cluster, gpus_per_node=size)


def _resolve_cluster(job: Job, catalog: Catalog, notes: list[str]):
    """(cluster with its accelerator and device count filled in, the accelerator's catalog row or None)."""
    cluster, par = job.cluster, job.parallel
    offer = catalog.offer(job.cost.offer) if job.cost.offer else None
    accelerator = None
    if cluster.accelerator is not None:
        accelerator = catalog.accelerator(cluster.accelerator)
    elif offer is not None:
        accelerator = catalog.accelerator(offer.accelerator)
        notes.append(f"accelerator {accelerator.name} taken from offer {offer.name}")
    if offer is not None:
        if accelerator.name != catalog.accelerator(offer.accelerator).name:
            raise SpecError(
                "cost.offer",
                offer.name,
                f"carries {offer.accelerator}, but the job runs on {accelerator.name}; "
                "pick an offer with the same accelerator (toolkit catalog offers)",
            )
        cluster = dataclasses.replace(cluster, accelerator=accelerator.name)
    elif accelerator is not None:
        cluster = dataclasses.replace(cluster, accelerator=accelerator.name)

    cluster = _nvlink_domain(cluster, accelerator, notes)
    count = cluster.count
    if count is None:
        if par.dp is not None:
            count = par.dp * model_parallel(par)
        elif offer is not None:
            count = offer.count
            notes.append(f"devices = {count}, one {offer.name} instance")
        else:
            count = model_parallel(par)
        cluster = dataclasses.replace(cluster, count=count)
    if count > cluster.gpus_per_node and count % cluster.gpus_per_node:
        raise SpecError(
            "cluster.count",
            count,
            f"spans more than one node but is not a multiple of cluster.gpus_per_node = "
            f"{cluster.gpus_per_node}; use {count - count % cluster.gpus_per_node} or "
            f"{count + cluster.gpus_per_node - count % cluster.gpus_per_node}",
        )
    return cluster, accelerator


def _resolve_precision(job: Job, accelerator, notes: list[str]):
    """The precision section with its mode filled in, checked against the accelerator's units."""
    precision = job.precision
    if precision.mode is None:
        bf16 = accelerator is None or "bf16" not in accelerator.unsupported
        precision = dataclasses.replace(precision, mode="amp-bf16" if bf16 else "amp-fp16")
        if not bf16:
            notes.append(f"precision = amp-fp16: {accelerator.name} has no bf16 units")
    mode = precision.mode
    if precision.grad_dtype == "fp32" and not precision.plan.master_weights:
        raise SpecError(
            "precision.grad_dtype",
            "fp32",
            f"fp32 main gradients apply to mixed-bf16/mixed-fp16 only (precision.mode = {mode} "
            "already keeps fp32 gradients, or none)",
        )
    if accelerator is not None and compute_dtype(mode) in accelerator.unsupported:
        options = [
            m
            for m in ("amp-bf16", "amp-fp16", "mixed-bf16", "mixed-fp16", "pure-bf16", "fp32")
            if compute_dtype(m) not in accelerator.unsupported
        ]
        raise SpecError(
            "precision.mode",
            mode,
            f"{accelerator.name} has no {compute_dtype(mode)} math units; use one of {', '.join(options)}",
        )
    fsdp = job.parallel.zero >= 2 and mode in TORCH_SEMANTICS and job.parallel.backend != "deepspeed"
    if precision.fp8_all_gather and not (precision.fp8 and fsdp):
        raise SpecError(
            "precision.fp8_all_gather",
            True,
            "gathers FSDP2's float8 weights: needs precision.fp8 with ZeRO-2/3 and an amp-*, fp32 or "
            "pure-bf16 mode (torch's FSDP2); drop it or set those",
        )
    if precision.fp8_all_gather:
        notes.append(
            "FSDP2 gathers the blocks' linear weights in float8 (torchao's enable_fsdp_float8_all_gather): "
            "1 byte each on the wire and in the gathered blocks; estimated, not traced (float8 needs CUDA)"
        )
    if precision.fp8:
        if mode == "fp32":
            raise SpecError(
                "precision.fp8", True, "FP8 matmuls pair with a 16-bit mode (amp-bf16, mixed-bf16, ...), not fp32"
            )
        if accelerator is not None and accelerator.peak_flops("fp8") is None:
            reason = "has no FP8 units" if "fp8" in accelerator.unsupported else "has no published FP8 peak"
            raise SpecError(
                "precision.fp8",
                True,
                f"{accelerator.name} {reason}; FP8 runs on e.g. H100-SXM, H200, MI300X (toolkit catalog accelerators)",
            )
        if precision.fp8_recipe == "mxfp8" and accelerator is not None and not accelerator.microscaling:
            raise SpecError(
                "precision.fp8_recipe",
                "mxfp8",
                f"MXFP8 needs microscaling tensor cores (Blackwell: B200, GB200, B300, GB300; MI355X); {accelerator.name} "
                "has none: use tensorwise, delayed or blockwise",
            )
    return precision


def _check_sharding(job: Job, par, mode: str, notes: list[str]) -> None:
    """Offload and the backend against the mode and ZeRO stage; notes on memory options that do little."""
    torch_semantics = mode in TORCH_SEMANTICS and not deepspeed_fp32(par.backend, mode, par.zero, par.tp, par.pp)
    if not optimizer_offload_fits(par.offload, par.zero, torch_semantics):
        if torch_semantics:
            raise SpecError(
                "parallel.offload",
                "optimizer",
                f"torch's FSDP2 (used for precision.mode = {mode}) offloads parameters, gradients and "
                "optimizer states together: use offload = params with zero 2 or 3, or a mixed-* "
                "precision for DeepSpeed's ZeRO-Offload",
            )
        raise SpecError("parallel.offload", "optimizer", "ZeRO-Offload needs parallel.zero = 1, 2 or 3")
    if not params_offload_fits(par.offload, par.zero, torch_semantics):
        need = (2, 3) if torch_semantics else (3,)
        raise SpecError(
            "parallel.offload",
            "params",
            f"parameter offload needs parallel.zero = {' or '.join(map(str, need))} "
            f"({'FSDP2' if torch_semantics else 'DeepSpeed ZeRO-3'}); got zero = {par.zero}",
        )
    _check_backend(par, mode)
    if par.zero > 0 and par.dp == 1:
        notes.append(f"ZeRO-{par.zero} with dp = 1 shards nothing: it only adds communication")
    plain_blocks = job.memory.act_compress == "none" and not job.finetune.adapters
    if not per_op_recompute_fits(job.memory.recompute, par.backend, mode, par.zero, par.tp, par.pp, plain_blocks):
        if not plain_blocks:
            what = "int8 activations" if job.memory.act_compress != "none" else "adapters"
            raise SpecError(
                "memory.recompute",
                "selective-op",
                f"per-op recompute is not combined with {what} (both decide what a block saves); use selective or full",
            )
        raise SpecError(
            "memory.recompute",
            "selective-op",
            f"per-op recompute is torch's checkpoint policy "
            f"(torchtitan's); {job.backend}'s program has none: use selective or full, or fp32, amp-* "
            "or pure-bf16 (torch)",
        )
    if job.memory.act_compress != "none" and job.memory.recompute == "full":
        notes.append(
            "int8 compression with full recompute compresses only the block inputs it keeps: "
            "little to gain, and rounding errors enter every recomputed block"
        )
    if job.memory.recompute == "selective" and job.memory.attention == "flash" and job.model.dropout == 0:
        notes.append(
            "selective recompute of flash attention saves little: the fused kernel stores no score matrix to begin with"
        )
    if job.optimizer.name != "sgd" and job.optimizer.momentum != 0.9:
        notes.append("optimizer.momentum applies to sgd only; ignored")


def _resolve_batch(job: Job, par, catalog: Catalog, notes: list[str], workload: str = "train"):
    """(the batch with its global batch filled in, the model's preset or None). A fine-tune does not take the
    preset's pretraining batch: one micro-batch a replica unless given."""
    batch = job.batch
    per_step = batch.micro_batch * par.dp
    global_batch = batch.global_batch
    preset = catalog.presets.get((job.model.name or "").lower())
    if global_batch is None:
        published = preset.global_batch_in_sequences() if preset and workload == "train" else None
        if published is not None:
            step = per_step * (par.pp if par.vpp > 1 else 1)  # interleaved: whole rounds of micro-batches
            named = "micro-batch × dp" + (" × pp (interleaved stages)" if par.vpp > 1 else "")
            global_batch = -(-published // step) * step
            notes.append(
                f"global batch = {global_batch} sequences: the smallest multiple of {named} = "
                f"{step} at least the published {published}"
            )
        else:
            global_batch = per_step
            why = (
                "a fine-tune: the pretraining batch does not apply"
                if workload == "finetune" and preset
                else "no published batch to follow"
            )
            notes.append(f"global batch = micro-batch × dp = {per_step} ({why}; give --global-batch)")
    elif not batch_split(global_batch, batch.micro_batch, par.dp):
        lower = global_batch - global_batch % per_step
        options = ([lower] if lower else []) + [lower + per_step]
        raise SpecError(
            "batch.global_batch",
            global_batch,
            f"must be a multiple of micro_batch × dp = {batch.micro_batch} × {par.dp} = {per_step}; "
            f"nearest: {' or '.join(map(str, options))}",
        )
    if par.vpp > 1:
        check_interleaved_rounds(global_batch // per_step, par.pp, par.vpp, per_step)
    return dataclasses.replace(batch, global_batch=global_batch), preset
