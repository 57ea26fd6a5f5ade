"""What one rank trains: the job's model, laid out by toolkit.program.parallelize (or cut into pipeline stages, or
handed to DeepSpeed's engine), and the optimizer that steps it. toolkit.train.loop runs it.

    prog = build_program(job, torch_precision(mode), device, device_mesh(job, device.type))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..specs import Job
from ..specs.job import compute_dtype
from .layout import Layout
from .lora import apply_lora
from .model import GPT
from .moe import aux_loss_scale, expert_parallel
from .optim import build_optimizer
from .parallel import tensor_parallel
from .parallelize import (
    all_reduce_mean,
    apply_fsdp,
    fsdp_mesh,
    is_sharded,
    needs_grad_all_reduce,
    parallelize,
    reduce_replicas,
)
from .precision import MasterWeights, use_fp32_norms
from .qlora import apply_qlora

__all__ = [
    "Program",
    "build_program",
    "build_model",
    "compile_blocks",
    "build_pipeline",
    "deepspeed_program",
    "backward_micro_batch",
    "step_optimizer",
    "steppers",
    "LoadWeights",
]

LoadWeights = Callable[[torch.nn.Module], None]
"""Loads a run's starting weights into the freshly built model (the runner's; the program reads no files)."""


def compile_blocks(model: torch.nn.Module) -> None:
    """torchtitan's per-block torch.compile, in place: the blocks keep their names and checkpoint keys, the model
    around them stays eager. (The runner calls it after the steps it measures with MemTracker: a block first called
    under a dispatch mode stays eager for good.)"""
    for block in model.blocks:
        block.compile()


def frozen_matrices_to(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The blocks' frozen Linear weights in `dtype` (LoRA's base as fine-tunes load it: autocast multiplies in that
    dtype anyway, so the products and what they save are unchanged; the fp32 copy is what goes)."""
    for block in model.blocks:
        for module in block.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.requires_grad:
                module.weight.data = module.weight.data.to(dtype)


def build_model(job: Job, param_dtype: torch.dtype, load_weights: LoadWeights | None = None) -> torch.nn.Module:
    """The job's GPT with its starting weights (`load_weights`: the runner's loader of `training.init_from`),
    then its adapters (LoRA, QLoRA over the loaded weights) and fp32 norms."""
    model = GPT(job.model, attention=job.memory.attention, recompute=job.memory.recompute, dtype=param_dtype)
    if load_weights is not None:
        load_weights(model)
    if job.finetune.method == "lora":
        apply_lora(model, job.finetune.rank, job.finetune.alpha, job.finetune.targets)
        if job.finetune.base_16bit(job.precision.mode):
            frozen_matrices_to(model, torch.float16 if compute_dtype(job.precision.mode) == "fp16" else torch.bfloat16)
    elif job.finetune.method == "qlora":
        apply_qlora(
            model,
            job.finetune.rank,
            job.finetune.alpha,
            job.finetune.targets,
            compute_dtype=torch.float16 if compute_dtype(job.precision.mode) == "fp16" else torch.bfloat16,
        )
    if job.training.fp32_norm:
        use_fp32_norms(model)
    return model


@dataclass
class Program:
    """What the set-up built for this rank: the module forward and backward call (DDP, the FSDP2 root or the
    model itself), the plain model beneath it (names as in the whole model), and what steps it."""

    model: torch.nn.Module
    raw: torch.nn.Module
    optimizer: torch.optim.Optimizer
    master: MasterWeights | None
    params: list
    """What the optimizer steps and clipping measures: the fp32 masters, or the trainable parameters."""
    layout: Layout
    reduce_grads: Callable[[], None] | None = None
    """Averages gradients over the replicas after the last backward, where no DDP does it."""
    schedule: object | None = None
    """Pipelines: torch's schedule over this rank's stages (`raw` is then the ModuleList of its chunks)."""
    pp_rank: int = 0
    stage_group: object | None = None
    """Pipelines: the pipeline ranks, over which the gradient norm and evaluation pass."""
    counted: list | None = None
    """Pipelines: the parameters counted in the gradient norm (a tied head's copy is not)."""
    engine: object | None = None
    """The DeepSpeed backend's engine (`model` is the engine, `optimizer` DeepSpeed's): it runs backward and step."""
    clock: object | None = None
    """Pipelines: toolkit.program.pipeline.StageClock over this rank's stages (times one step's chunks)."""
    tp_mesh: object | None = None
    """Pipelines: the tensor-parallel mesh their stages are sharded over (tp × pp), else None."""


def build_program(job: Job, plan, device: torch.device, mesh, load_weights: LoadWeights | None = None) -> Program:
    """The job's model, parallelized by toolkit.program.parallelize, and its optimizer."""
    if job.parallel.pp > 1:
        return build_pipeline(job, plan, device, mesh, load_weights)
    if job.backend == "deepspeed":
        return _build_deepspeed(job, plan, load_weights)
    torch.manual_seed(job.training.seed)  # the same initial weights on every rank
    raw = build_model(job, plan.param_dtype, load_weights).to(device)
    main_grads = job.precision.grad_dtype == "fp32"
    # fp32 main gradients are all-reduced by hand once per step, as Megatron does: no DDP around them
    model = raw if main_grads else parallelize(raw, job, mesh, device)
    zero1 = job.parallel.zero == 1 and mesh is not None
    master, params, optimizer = steppers(job, plan, raw, mesh["dp"].get_group() if zero1 else None)
    layout = Layout(sharded=is_sharded(job) and mesh is not None, zero1=zero1)
    reduce_grads = None  # (the tensors are looked up at each call: gradients are set to None)
    if main_grads and mesh is not None:
        reduce_grads = lambda: all_reduce_mean(master.grad_buffers(), flatten=False)  # noqa: E731
    elif needs_grad_all_reduce(job, mesh):
        reduce = reduce_replicas(raw, mesh)
        reduce_grads = lambda: reduce(params)  # noqa: E731
    return Program(model, raw, optimizer, master, params, layout, reduce_grads)


def steppers(job: Job, plan, raw: torch.nn.Module, zero1_group=None):
    """(fp32 masters or None, what the optimizer steps, the optimizer) for a laid-out model: mixed-* modes step
    fp32 masters of the 16-bit weights (toolkit.program.precision), the others the trainable parameters; torch's
    ZeRO-1 shares the states out over `zero1_group`. The runner and the tracer (toolkit.trace.memory) both."""
    master = MasterWeights(raw, main_grads=job.precision.grad_dtype == "fp32") if plan.master_weights else None
    params = master.params if master else [p for p in raw.parameters() if p.requires_grad]
    return master, params, build_optimizer(job, params, zero1_group=zero1_group)


def _build_deepspeed(job: Job, plan, load_weights: LoadWeights | None) -> Program:
    """The model in its 16-bit dtype and the job's optimizer, handed to DeepSpeed's engine (ZeRO as configured by
    deepspeed_config(job)); the fp32 masters start from the 16-bit weights, as MasterWeights' do in one process."""
    torch.manual_seed(job.training.seed)
    return deepspeed_program(job, build_model(job, plan.param_dtype, load_weights))


def deepspeed_program(job: Job, raw: torch.nn.Module) -> Program:
    """DeepSpeed's engine around a built model (the tracer builds its engine under its tracker: it sees every
    flat buffer DeepSpeed makes)."""
    from .deepspeed import deepspeed_engine

    params = [p for p in raw.parameters() if p.requires_grad]
    engine, optimizer = deepspeed_engine(job, raw, build_optimizer(job, params))
    return Program(engine, engine.module, optimizer, None, params, Layout(), engine=engine)


def build_pipeline(job: Job, plan, device: torch.device, mesh, load_weights: LoadWeights | None = None) -> Program:
    """This rank's pipeline chunks of the whole model (built in full with the run's seed, so the weights are
    one process's), tensor-parallel over the mesh's tp dimension when tp > 1, FSDP2 over dp at ZeRO-2/3, their
    optimizer (ZeroRedundancyOptimizer over dp at ZeRO-1) and schedule; replicas over dp average gradients by
    hand."""
    from . import pipeline

    torch.manual_seed(job.training.seed)
    whole = build_model(job, plan.param_dtype, load_weights)
    pp_rank = mesh["pp"].get_local_rank()
    stages = pipeline.split_stages(whole, job, pp_rank).to(device)
    name_of = {id(p): n for n, p in whole.named_parameters()}  # a tied head is the embedding's name
    whole_names = {name: name_of[id(p)] for name, p in stages.named_parameters()}
    keys = pipeline.stage_state_keys(stages, job, pp_rank)
    del whole  # the other stages' weights go with it
    tp_mesh = mesh["tp"] if job.parallel.tp > 1 else None
    if tp_mesh is not None:  # (replaces the parameters: names, not identities, carry over)
        for stage in stages:
            tensor_parallel(stage, tp_mesh, sequence_parallel=job.parallel.sp, local_logits=True)
    if job.parallel.ep > 1:
        expert_parallel(stages, mesh["ep"], edp_mesh=mesh["edp"])
    fsdp = job.parallel.zero >= 2
    edp_mesh = mesh["edp"] if job.parallel.ep > 1 else None
    if fsdp:  # each chunk its own FSDP2 root over dp (torch's schedule drives it)
        for stage in stages:
            apply_fsdp(stage, job, fsdp_mesh(mesh, job), device.type == "cuda", edp_mesh)
    zero1 = job.parallel.zero == 1 and mesh["dp"].size() > 1  # each stage's replicas share out its states
    layout = Layout(
        sharded=fsdp,
        zero1=zero1,
        stage_keys=keys,
        stage_params={id(p): whole_names[n] for n, p in stages.named_parameters()},
    )
    params = [p for p in stages.parameters() if p.requires_grad]
    optimizer = build_optimizer(job, params, zero1_group=mesh["dp"].get_group() if zero1 else None)
    pp_group = mesh["pp"].get_group()
    clock = pipeline.StageClock()
    schedule = pipeline.build_schedule(stages, job, device, pp_group, clock, tp_mesh)
    tied = pipeline.embedding_group(job, mesh)
    replicas = reduce_replicas(stages, mesh) if mesh["dp"].size() > 1 and not fsdp else None  # FSDP2 reduce-scatters

    def reduce_grads():
        pipeline.sum_tied_grads(stages, tied)
        if replicas is not None:
            replicas(params)

    return Program(
        stages,
        stages,
        optimizer,
        None,
        params,
        layout,
        reduce_grads,
        schedule=schedule,
        pp_rank=pp_rank,
        stage_group=pp_group,
        counted=pipeline.counted_params(stages, job),
        clock=clock,
        tp_mesh=tp_mesh,
    )


def backward_micro_batch(prog: Program, scaler, loss: torch.Tensor, accum: int, last: bool) -> None:
    """One micro-batch's backward: of loss / accumulation (scaled for fp16), or through DeepSpeed's engine, which
    divides by the accumulation itself and must be stepped after every micro-batch but the last (it counts them)."""
    if prog.engine is None:
        with aux_loss_scale((scaler.get_scale() if scaler.is_enabled() else 1.0) / accum):
            scaler.scale(loss / accum).backward()
        return
    prog.engine.backward(loss)
    if not last:
        prog.engine.step()


def step_optimizer(prog: Program, scaler, scale_before: float | None) -> bool:
    """The update; True if it was skipped (fp16 overflow: the loss scale falls)."""
    if prog.engine is not None:
        prog.engine.step()  # the accumulation boundary: clip, step, reduce or gather, zero
        return not prog.engine.was_step_applied()
    scaler.step(prog.optimizer)
    scaler.update()
    prog.optimizer.zero_grad(set_to_none=True)
    return scale_before is not None and scaler.get_scale() < scale_before
