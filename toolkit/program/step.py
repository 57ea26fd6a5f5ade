"""What one training step and one evaluation do on this rank, whatever the layout: the micro-batches through
a pipeline schedule or the plain model, the loss every rank agrees on, and the ranks' agreement on a flag.
toolkit.train.loop's Trainer calls them in order, and so does the tracer (toolkit.trace) on fake tensors or its
gloo ranks: `forward_backward`, `reduce_and_clip` and `apply_update` are the one step both run.

A step's `recorder` sees it from inside (toolkit.train.memory_record.MemoryRecorder in a run, the tracer's
hooks in a trace): `micro_batch(last)` before each micro-batch, `forward_done()` between its forward and
backward, `backward_done()` once the step's gradients are all made (before any reaches the fp32 masters), and
`optimizer_step(step)` as a context around the update."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..specs import Job
from .build import Program, backward_micro_batch, step_optimizer
from .optim import clip_grad_norm
from .parallel import loss_parallel

__all__ = [
    "forward_backward",
    "reduce_and_clip",
    "apply_update",
    "pipeline_micro_batches",
    "timeline_of",
    "micro_batch_context",
    "local_value",
    "mean_step_loss",
    "agree",
    "evaluate",
    "forward_loss",
]


def forward_backward(
    prog: Program,
    job: Job,
    plan,
    scaler,
    batches,
    device,
    recorder,
    *,
    int8=None,
    micro_batches: int | None = None,
    timeline: dict | None = None,
    on_timeline: Callable[[dict], None] | None = None,
) -> torch.Tensor:
    """One step's micro-batches, forward and backward (through the pipeline schedule when there is one); the sum
    of their losses on this rank. `micro_batches` defaults to the job's accumulation (the tracer runs fewer)."""
    if prog.schedule is not None:
        recorder.micro_batch(True)
        loss_sum = pipeline_micro_batches(prog, job, plan, batches, device, timeline, on_timeline)
        recorder.backward_done()
        return loss_sum
    accum = micro_batches or job.grad_accum
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        inputs, targets = next(batches)
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        last = micro == accum - 1
        recorder.micro_batch(last)
        with micro_batch_context(prog, job, last=last):
            with plan.autocast(device.type), int8 or contextlib.nullcontext():
                loss = prog.model(inputs, targets)
            recorder.forward_done()
            backward_micro_batch(prog, scaler, loss, accum, last=last)
        loss_sum += local_value(loss.detach()).float()
    recorder.backward_done()
    return loss_sum


def reduce_and_clip(prog: Program, scaler, max_norm: float):
    """Gradients made ready for the update: 16-bit ones moved to the fp32 masters (mixed-*), averaged where no DDP
    or FSDP2 does, unscaled (fp16), clipped to `max_norm` (inf: measured only). Returns the global norm before
    clipping (a float or a 0-d tensor: take float() of it; 0.0 under DeepSpeed, which clips inside its step)."""
    if prog.master:
        prog.master.grads_to_master()
    if prog.reduce_grads:
        prog.reduce_grads()
    scaler.unscale_(prog.optimizer)
    if prog.engine is not None:
        return 0.0
    return clip_grad_norm(prog.params, max_norm, prog.stage_group, prog.counted)


def apply_update(prog: Program, scaler, scale_before: float | None, recorder, step: int) -> bool:
    """The optimizer's step (inside the recorder's `optimizer_step`), then the 16-bit weights from the masters.
    True if an fp16 overflow skipped it."""
    with recorder.optimizer_step(step):
        skipped = step_optimizer(prog, scaler, scale_before)
    if prog.master:
        prog.master.zero_grad()
        if not skipped:
            prog.master.master_to_model()
    return skipped


def pipeline_micro_batches(
    prog: Program, job: Job, plan, batches, device, timeline: dict | None = None, on_timeline=None
) -> torch.Tensor:
    """One step's micro-batches through the schedule; the sum of their losses on the last stage, 0 elsewhere.
    With `timeline` (the step's identity), the stage's chunks are timed from a barrier of the pipeline's ranks
    and handed to `on_timeline` (the runner writes OUT/pipeline/rank{stage}.json for `toolkit pipeline --run`:
    the program reads and writes no files)."""
    from .pipeline import run_schedule

    pairs = [next(batches) for _ in range(job.grad_accum)]
    tokens = torch.cat([x for x, _ in pairs]).to(device)
    targets = torch.cat([y for _, y in pairs]).to(device)
    losses: list = []
    if timeline is not None:
        dist.barrier(group=prog.stage_group)
        prog.clock.start()
    with plan.autocast(device.type):
        run_schedule(prog.schedule, job, prog.pp_rank, tokens, targets, losses)
    if timeline is not None:
        spans, step_s = prog.clock.stop()
        if on_timeline is not None:
            on_timeline(dict(timeline, stage=prog.pp_rank, step_s=step_s, spans=spans))
    return sum((loss.detach().float() for loss in losses), torch.zeros((), device=device))


def timeline_of(job: Job, prog: Program, mesh, dp_rank: int, step: int) -> dict | None:
    """The identity of the timed pipeline step (the third, after the memory-recording ones; or the last of a
    shorter run), for the first pipeline's ranks only; None for every other step and rank."""
    if prog.schedule is None or step != min(2, job.training.steps - 1):
        return None
    if dp_rank != 0 or (job.parallel.tp > 1 and mesh["tp"].get_local_rank() != 0):
        return None
    schedule = "interleaved" if job.parallel.vpp > 1 else job.parallel.schedule
    return {
        "step": step + 1,
        "schedule": schedule,
        "stages": job.parallel.pp,
        "microbatches": job.grad_accum,
        "vpp": job.parallel.vpp,
    }


def micro_batch_context(prog: Program, job: Job, last: bool):
    """DDP syncs gradients on the last micro-batch only; FSDP2 reduce-scatters every one (as the tracer measures);
    tensor parallelism computes the loss on vocabulary-sharded logits."""
    from torch.nn.parallel import DistributedDataParallel

    stack = contextlib.ExitStack()
    if isinstance(prog.model, DistributedDataParallel) and not last:
        stack.enter_context(prog.model.no_sync())
    if job.parallel.tp > 1:
        stack.enter_context(loss_parallel())
    return stack


def local_value(loss: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor loss (tensor parallelism) as a plain tensor; anything else as it is."""
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def mean_step_loss(loss_sum: torch.Tensor, world: int, pp: int) -> float:
    """The step's loss on every rank: the mean over the ranks that computed one (all but earlier pipeline stages;
    the ranks of a tensor-parallel group hold the same value)."""
    if world == 1:
        return float(loss_sum)
    total = loss_sum.clone()
    torch.distributed.all_reduce(total)
    return float(total) / (world // pp)


def agree(flag: bool, device, world: int) -> bool:
    """True on every rank if any rank was asked to stop (a SIGTERM may reach one process first)."""
    if world == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


@torch.no_grad()
def evaluate(
    prog: Program, val_set, job: Job, plan, device, rank: int, world: int, before_forward=lambda: None
) -> float:
    """Mean loss over the same eval_batches × micro_batch held-out windows whatever the number of replicas:
    replica r takes windows r, r + world, ...; losses and counts are summed over ranks (the ranks of one
    tensor-parallel group add the same figures to both). Every rank runs the same number of forwards, as the
    collectives of FSDP2 and tensor parallelism require; a rank with no window left runs one that counts 0.
    Pipeline stages pass each batch rank to rank; only the last stage's rank counts it."""
    model = prog.raw
    model.eval()
    mb, count = job.batch.micro_batch, job.training.eval_batches * job.batch.micro_batch
    mine = [i % len(val_set) for i in range(rank, count, world)]
    forwards = math.ceil(math.ceil(count / world) / mb)
    vocab_parallel = loss_parallel if job.parallel.tp > 1 else contextlib.nullcontext
    sums = torch.zeros(2, device=device, dtype=torch.float64)
    for chunk in range(forwards):
        ids = mine[chunk * mb : (chunk + 1) * mb]
        window = torch.stack([val_set[i] for i in ids or [0]]).to(device)
        before_forward()
        with plan.autocast(device.type), vocab_parallel():
            loss = local_value(forward_loss(prog, job, plan, window[:, :-1], window[:, 1:]))
        if loss is not None:
            sums[0] += loss.double() * len(ids)
            sums[1] += len(ids)
    model.train()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(sums)
    return float(sums[0] / sums[1])


def forward_loss(prog: Program, job: Job, plan, tokens: torch.Tensor, targets: torch.Tensor):
    """The model's loss on one batch, without backward; None on a pipeline rank that does not hold the last chunk."""
    if prog.schedule is None:
        return prog.raw(tokens, targets)
    from .pipeline import pipeline_forward

    return pipeline_forward(
        prog.raw, job, prog.pp_rank, prog.stage_group, tokens, targets, plan.param_dtype, prog.tp_mesh
    )
