"""Pipeline parallelism over the runner's GPT, shared by the runner and the tracer: stages and torch's schedules.

    stages = split_stages(model, job, pp_rank)             # this rank's chunks: one, or vpp when interleaved
    schedule = build_schedule(stages, job, device, group)  # GPipe, 1F1B or interleaved 1F1B (torch.distributed.pipelining)
    run_schedule(schedule, job, pp_rank, tokens, targets, losses)   # one step's forwards and backwards

Under interleaving (vpp > 1) rank r holds chunks r, r + pp, r + 2·pp, ... of pp·vpp chunks (equal, or the first
and last shorter when they do not divide the layers: toolkit.specs.stages). The loss is
each micro-batch's mean cross-entropy and the schedule divides gradients by the number of micro-batches, which
is what gradient accumulation does in one process. With tied embeddings the first and the last stage each keep
the matrix; `sum_tied_grads` adds their gradients so the two copies take identical steps (Megatron's embedding
group). `pipeline_forward` runs one forward through the stages without a schedule (evaluation, any batch size).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..specs.job import Job
from ..specs.stages import chunk_layers
from .parallel import PipelineStage, loss_parallel, vocab_parallel_loss
from .precision import TORCH_DTYPES

__all__ = [
    "stage_chunks",
    "split_stages",
    "stage_state_keys",
    "loss_fn",
    "stage_loss",
    "stream_tokens",
    "stage_examples",
    "build_schedule",
    "run_schedule",
    "embedding_group",
    "sum_tied_grads",
    "pipeline_forward",
    "counted_params",
]


def stage_chunks(job: Job, pp_rank: int) -> list[int]:
    """The chunks (global stage indices) this pipeline rank runs, in order."""
    pp, vpp = job.parallel.pp, job.parallel.vpp
    return list(range(pp_rank, pp * vpp, pp))


def split_stages(model: nn.Module, job: Job, pp_rank: int) -> nn.ModuleList:
    """This rank's chunks of the whole `model`; they share its parameters (the rest can be dropped)."""
    sizes = job_chunk_layers(job)
    return nn.ModuleList(PipelineStage(model, chunk, sizes) for chunk in stage_chunks(job, pp_rank))


def job_chunk_layers(job: Job) -> list[int]:
    """Layers of each pipeline chunk, in model order (equal, or the first and last shorter: toolkit.specs.stages)."""
    par = job.parallel
    return chunk_layers(job.model.layers, par.pp, par.vpp, par.stage_layers)


def stage_state_keys(stages: nn.ModuleList, job: Job, pp_rank: int) -> dict[str, str]:
    """{this rank's state-dict key: the whole model's key}: "1.blocks.0.attn.q.weight" on the second chunk of
    four 2-block chunks is "blocks.2.attn.q.weight"; embeddings, norm and head keep their names."""
    sizes = job_chunk_layers(job)
    keys = {}
    for i, chunk in enumerate(stage_chunks(job, pp_rank)):
        for key in stages[i].state_dict():
            whole = key
            if key.startswith("blocks."):
                _, index, rest = key.split(".", 2)
                whole = f"blocks.{sum(sizes[:chunk]) + int(index)}.{rest}"
            keys[f"{i}.{key}"] = whole
    return keys


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's own loss (toolkit.program.model.GPT.forward): mean cross-entropy in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def _shard_size(size: int, parts: int, index: int) -> int:
    """The length of part `index` when `size` is cut into `parts` as torch.chunk (and DTensor's Shard) cut it."""
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


def stream_tokens(job: Job, tp_rank: int = 0) -> int:
    """Tokens per sequence in the residual stream a stage sends: all of them, or under sequence parallelism this
    tensor-parallel rank's share."""
    seq, tp = job.model.seq_len, job.parallel.tp
    return _shard_size(seq, tp, tp_rank) if job.parallel.sp and tp > 1 else seq


def stage_examples(job: Job, chunk: int, device: torch.device, tp_rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of one micro-batch through `chunk`: token ids or the residual stream in, the residual stream
    or the logits out, as this tensor-parallel rank holds them (its tokens under sequence parallelism, its
    vocabulary columns of the logits). Given to torch's stages, they replace its shape inference, whose backward
    pass MemTracker's module hooks break. Under autocast the residual stream stays fp32 and the logits are 16-bit;
    FSDP2 stages (ZeRO-2/3) gather 16-bit weights and cast their inputs to them, so their stream is 16-bit too (a
    16-bit tensor sent into an fp32 buffer would arrive as garbage)."""
    plan, spec, b, tp = job.precision.plan, job.model, job.batch.micro_batch, job.parallel.tp
    chunks = job.parallel.pp * job.parallel.vpp
    fsdp_16bit = plan.autocast and job.parallel.zero >= 2
    stream = TORCH_DTYPES[plan.autocast if fsdp_16bit else plan.weights]  # (mixed-* is not run under pipelines)
    logits = TORCH_DTYPES[plan.autocast] if plan.autocast else stream
    tokens = stream_tokens(job, tp_rank)
    example_in = (
        torch.zeros(b, spec.seq_len, dtype=torch.long, device=device)
        if chunk == 0
        else torch.zeros(b, tokens, spec.hidden, dtype=stream, device=device, requires_grad=True)
    )
    if chunk == chunks - 1:
        shape, dtype = (b, spec.seq_len, _shard_size(spec.vocab, tp, tp_rank)), logits
    else:
        shape, dtype = (b, tokens, spec.hidden), stream
    example_out = torch.zeros(*shape, dtype=dtype, device=device, requires_grad=True)  # (gradients come back for these)
    return example_in, example_out


class StageClock:
    """When each of this rank's chunks runs, in the steps it is asked to time: wraps the torch stages'
    forward_one_chunk / backward_one_chunk / backward_weight_one_chunk (the calls every schedule makes) and
    keeps (kind, micro-batch, virtual stage, start, end) in seconds from the step's start. Off, it adds one
    attribute check per chunk."""

    def __init__(self):
        self.spans: list[dict] | None = None
        self.started_s = 0.0

    def attach(self, torch_stage) -> None:
        for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"), ("backward_weight_one_chunk", "W")):
            setattr(torch_stage, name, self._timed(getattr(torch_stage, name), kind, torch_stage.stage_index))

    def _timed(self, method, kind: str, stage: int):
        def run(chunk, *args, **kwargs):
            if self.spans is None:
                return method(chunk, *args, **kwargs)
            start_s = time.perf_counter() - self.started_s
            try:
                return method(chunk, *args, **kwargs)
            finally:
                self.spans.append(
                    {
                        "kind": kind,
                        "micro": chunk,
                        "stage": stage,
                        "start_s": start_s,
                        "end_s": time.perf_counter() - self.started_s,
                    }
                )

        return run

    def start(self) -> None:
        self.spans, self.started_s = [], time.perf_counter()

    def stop(self) -> tuple[list[dict], float]:
        """(spans, seconds since start); timing stops."""
        spans, self.spans = self.spans or [], None
        return spans, time.perf_counter() - self.started_s


def stage_loss(job: Job, tp_mesh=None):
    """The last stage's loss: the GPT's own, or under tensor parallelism the vocabulary-parallel one over this
    rank's columns of the logits (run it under `loss_parallel()`, as `run_schedule` does)."""
    return vocab_parallel_loss(tp_mesh, job.model.vocab) if tp_mesh is not None else loss_fn


def build_schedule(
    stages: nn.ModuleList, job: Job, device: torch.device, group=None, clock: StageClock | None = None, tp_mesh=None
):
    """torch's schedule for this rank's chunks, over `group` (the pipeline ranks); `clock` times their chunks;
    `tp_mesh`: the stages are tensor-parallel over it (toolkit.program.parallel.tensor_parallel)."""
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    chunks, m = job.parallel.pp * job.parallel.vpp, job.grad_accum or 1
    tp_rank = tp_mesh.get_local_rank() if tp_mesh is not None else 0
    loss = stage_loss(job, tp_mesh)
    torch_stages = []
    for module, chunk in zip(stages, stage_chunks(job, _rank_in(group))):
        example_in, example_out = stage_examples(job, chunk, device, tp_rank)
        torch_stages.append(
            TorchStage(module, chunk, chunks, device, input_args=(example_in,), output_args=(example_out,), group=group)
        )
        if clock is not None:
            clock.attach(torch_stages[-1])
    if job.parallel.vpp > 1:
        return ScheduleInterleaved1F1B(torch_stages, m, loss_fn=loss)
    schedule = ScheduleGPipe if job.parallel.schedule == "gpipe" else Schedule1F1B
    return schedule(torch_stages[0], m, loss_fn=loss)


def _rank_in(group) -> int:
    return dist.get_rank(group) if group is not None else dist.get_rank()


def run_schedule(
    schedule, job: Job, pp_rank: int, tokens: torch.Tensor, targets: torch.Tensor, losses: list | None = None
) -> None:
    """One step: the first stage feeds the tokens of all micro-batches (stacked), the last takes the targets and
    appends each micro-batch's loss to `losses`; gradients are left on the stages' parameters."""
    first, last = pp_rank == 0, pp_rank == job.parallel.pp - 1
    args = (tokens,) if first else ()
    with loss_parallel() if job.parallel.tp > 1 else contextlib.nullcontext():  # (the loss's backward too)
        if last:
            schedule.step(*args, target=targets, losses=losses, return_outputs=False)
        else:
            schedule.step(*args)


def embedding_group(job: Job, mesh):
    """The group of the first and last pipeline ranks of this rank's (dp, tp) position, which both hold the tied
    embedding; None when nothing is tied across stages or this rank is a middle stage. Every rank calls it
    (creating groups is collective)."""
    if not job.model.tie_embeddings or job.parallel.pp == 1:
        return None
    if job.parallel.pp == 2:
        return mesh["pp"].get_group()
    mine = None
    columns = mesh.mesh.reshape(job.parallel.pp, -1).T  # (dp · tp, pp): each row one pipeline
    for column in columns.tolist():
        ends = [column[0], column[-1]]
        group = dist.new_group(ends)
        if dist.get_rank() in ends:
            mine = group
    return mine


def tied_weights(stages: nn.ModuleList) -> list[torch.nn.Parameter]:
    """This rank's copies of the tied embedding: the first chunk's table, the last chunk's head."""
    held = []
    for stage in stages:
        if stage.first and stage.tok is not None:
            held.append(stage.tok.weight)
        if stage.last and stage.head is not None:
            held.append(stage.head.weight)
    return held


def sum_tied_grads(stages: nn.ModuleList, group) -> None:
    """Add the first and last stage's gradients of the tied embedding, as one process would have."""
    if group is None:
        return
    for weight in tied_weights(stages):
        if weight.grad is not None:  # (under tensor parallelism, this rank's rows of the matrix)
            grad = weight.grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def counted_params(stages: nn.ModuleList, job: Job) -> list[torch.nn.Parameter]:
    """The parameters whose gradients count toward the global norm: the last stage's copy of a tied embedding
    is the first stage's, counted there."""
    skip = {
        id(stage.head.weight) for stage in stages if stage.last and stage.head is not None and job.model.tie_embeddings
    }
    return [p for p in stages.parameters() if p.requires_grad and id(p) not in skip]


def pipeline_forward(
    stages: nn.ModuleList,
    job: Job,
    pp_rank: int,
    group,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    act_dtype: torch.dtype,
    tp_mesh=None,
) -> torch.Tensor | None:
    """One forward of a batch through every chunk, in order, passing hidden states rank to rank (no schedule:
    evaluation, whatever the batch size). The loss on the rank holding the last chunk, None elsewhere. Under
    tensor parallelism (`tp_mesh`), call it inside `loss_parallel()`."""
    pp = job.parallel.pp
    tokens_here = stream_tokens(job, tp_mesh.get_local_rank() if tp_mesh is not None else 0)
    chunks = pp * job.parallel.vpp
    rows = tokens.shape[0]
    x = tokens
    for chunk in range(chunks):
        if chunk % pp != pp_rank:
            continue
        if chunk > 0:
            x = torch.empty(rows, tokens_here, job.model.hidden, dtype=act_dtype, device=tokens.device)
            dist.recv(x, src=dist.get_global_rank(group, (chunk - 1) % pp), group=group)
        x = stages[chunk // pp](x)
        if chunk < chunks - 1:
            dist.send(x.to(act_dtype).contiguous(), dst=dist.get_global_rank(group, (chunk + 1) % pp), group=group)
    return stage_loss(job, tp_mesh)(x, targets) if (chunks - 1) % pp == pp_rank else None
