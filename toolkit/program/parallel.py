"""Tensor, sequence and pipeline parallelism for the runner's GPT, with torch's DTensor plans (Megatron's layout).

    tensor_parallel(model, mesh, sequence_parallel=True)
    with loss_parallel():
        loss = model(tokens, targets)

q, k, v, up and gate are split by output columns, o and down by input rows, so each block
all-reduces twice in forward and twice in backward (Shoeybi et al. 2019). The token embedding
is split by rows and the output projection by vocabulary columns: the logits stay sharded and
the cross-entropy runs on them under `loss_parallel()` (no rank holds the full vocabulary).

With sequence parallelism (Korthikanti et al. 2022) the residual stream, the norms and the
dropouts hold 1/tp of the tokens; the block input is all-gathered before q/k/v and up/gate,
and o and down reduce-scatter instead of all-reducing. torch's linears keep the all-gathered
input for their weight gradients (Megatron instead keeps the shard and gathers it again in
backward); toolkit.estimate follows torch's program for fp32, amp-* and pure-bf16, and
Megatron's for the mixed-* modes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from .model import GPT
from .moe import MoE

__all__ = [
    "tensor_parallel",
    "block_plan",
    "vocab_parallel_loss",
    "shard_embedding_grad",
    "loss_parallel",
    "PipelineStage",
]


def tensor_parallel(
    model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool = False, local_logits: bool = False
) -> nn.Module:
    """Shard a toolkit.program.model.GPT, or one PipelineStage of it, over `mesh` (one dimension: the
    tensor-parallel group), in place. A stage shards what it holds (the embeddings on the first, the norm and
    head on the last). `local_logits`: the head returns this rank's vocabulary columns as a plain tensor (what a
    pipeline stage sends to its loss, `vocab_parallel_loss`); otherwise a DTensor for the model's own loss."""
    heads, kv_heads, tp = model.spec.heads, model.spec.kv_heads_, mesh.size()
    if heads % tp or kv_heads % tp:
        raise ValueError(
            f"tensor parallelism over {tp} ranks needs heads ({heads}) and kv heads ({kv_heads}) divisible by {tp}"
        )
    seq = Shard(1)  # the token dimension of (batch, seq, hidden)
    stream = seq if sequence_parallel else Replicate()
    for block in model.blocks:
        parallelize_module(block, mesh, block_plan(block, sequence_parallel))
    learned, plan = model.pos is not None, {}
    if model.tok is not None:
        plan["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate() if learned else stream)
        if (
            sequence_parallel and learned
        ):  # the position table is added to whole sequences, then each rank keeps its tokens
            plan["drop"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
    if model.head is not None:
        plan["head"] = ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=local_logits)
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
    if plan:
        parallelize_module(model, mesh, plan)
    if isinstance(model, PipelineStage):
        model.sequence_parallel = sequence_parallel
    if model.spec.tie_embeddings and model.tok is not None and model.head is not None:
        model.head.weight = model.tok.weight  # both keep vocabulary rows (Shard(0)): one matrix again
    if model.tok is not None and not model.tok.weight.is_meta:
        shard_embedding_grad(model)
    return model


def block_plan(block: nn.Module, sequence_parallel: bool) -> dict:
    """One block's DTensor plan (Megatron's split): q, k, v, up (and gate) by columns, o and down by rows; under
    sequence parallelism the norms and the residual stream stay sharded by token and each branch gathers its
    input. toolkit calibrate times a block under this same plan."""
    seq = Shard(1)
    stream = seq if sequence_parallel else Replicate()
    plan = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=stream),
    }
    if isinstance(block.mlp, MoE):  # whole on every rank (expert parallelism splits it): sequence parallelism
        if sequence_parallel:  # gathers its input and keeps this rank's tokens of its output
            plan["mlp"] = PrepareModuleInputOutput(
                input_layouts=(seq,),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(seq,),
                use_local_output=True,
            )
        return {**plan, **_sequence_parallel_norms(seq)} if sequence_parallel else plan
    plan["mlp.up"] = ColwiseParallel()
    plan["mlp.down"] = RowwiseParallel(output_layouts=stream)
    if block.mlp.swiglu:
        plan["mlp.gate"] = ColwiseParallel()
    if sequence_parallel:
        plan.update(
            {
                "norm1": SequenceParallel(),
                "norm2": SequenceParallel(),
                "attn": PrepareModuleInput(
                    input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            }
        )
    return plan


def _sequence_parallel_norms(seq) -> dict:
    """Sequence parallelism's norms (sharded by token) and the attention gathering its input."""
    return {
        "norm1": SequenceParallel(),
        "norm2": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
    }


def vocab_parallel_loss(mesh: DeviceMesh, vocab: int):
    """A pipeline's last-stage loss over logits sharded by vocabulary: `loss_fn(local_logits, targets)` is the
    GPT's mean cross-entropy, computed under `loss_parallel()` (no rank gathers the vocabulary), as a plain
    tensor (every rank of the group holds the same value)."""
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        shape = (*logits.shape[:-1], vocab)
        whole = DTensor.from_local(
            logits, mesh, [Shard(-1)], run_check=False, shape=shape, stride=torch.empty(shape, device="meta").stride()
        )
        return F.cross_entropy(whole.float().view(-1, vocab), targets.reshape(-1)).to_local()

    return loss_fn


def shard_embedding_grad(model: nn.Module) -> None:
    """DTensor's embedding backward returns a replicated (full-vocabulary) gradient for the row-sharded
    table; keep this rank's rows only, as the parameter is sharded (a local slice, no communication).
    Call again after `to_empty`, which replaces the parameter and drops its hooks."""
    weight = model.tok.weight
    weight.register_hook(lambda grad: grad.redistribute(grad.device_mesh, weight.placements))


class PipelineStage(GPT):
    """One pipeline stage of a GPT: the token (and learned position) embedding on the first, a contiguous run of
    blocks (`sizes[stage]` of them: toolkit.specs.stages.chunk_layers), the final norm and output projection on the
    last. It runs the GPT's own forward, which takes token ids (first stage) or the hidden states the previous
    stage sent, and returns hidden states or, on the last stage, the logits. With tied embeddings the first and
    the last stage each hold the matrix (as Megatron does): the runner sums its two gradients
    (toolkit.program.pipeline), so both copies take the same steps."""

    def __init__(self, model: GPT, stage: int, sizes: list[int]):
        nn.Module.__init__(self)  # the whole model's parts, not new ones
        if sum(sizes) != model.spec.layers:
            raise ValueError(f"pipeline chunks of {sizes} layers do not add up to the model's {model.spec.layers}")
        start = sum(sizes[:stage])
        self.first, self.last = stage == 0, stage == len(sizes) - 1
        self.tok = model.tok if self.first else None
        self.pos = model.pos if self.first else None
        self.drop = model.drop if self.first else None
        self.blocks = nn.ModuleList(model.blocks[start : start + sizes[stage]])
        self.norm = model.norm if self.last else None
        self.head = model.head if self.last else None
        self.recompute = model.recompute
        self.spec = model.spec
        self.sequence_parallel = False
        """Set by tensor_parallel: later stages then receive one tp rank's share of each sequence's tokens."""
        self.register_buffer("cos", model.cos, persistent=False)
        self.register_buffer("sin", model.sin, persistent=False)
