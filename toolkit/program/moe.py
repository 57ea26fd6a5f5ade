"""A Mixture-of-Experts MLP for the runner's GPT, and expert parallelism over a mesh dimension.

    moe = MoE(spec)                        # router, routed experts (grouped weights), shared experts
    y = moe(x)                             # moe.aux: this call's balancing loss (per sequence, averaged)
    expert_parallel(model, mesh["ep"])     # each rank keeps experts / ep of every block's experts

Routing is token-choice top-k (Mixtral, Qwen, OLMoE, DeepSeek): the router's softmax (or sigmoid) scores pick each
token's k experts, whose outputs are summed weighted by the scores renormalised over the k. Dropless: every expert
takes every token sent to it. DeepSeek-V3's sigmoid router picks by score plus a per-expert bias (a buffer, the
auxiliary-loss-free balancing), weighting by the scores alone. The balancing loss is Switch Transformer's,
experts · Σ_i f_i · P_i (f_i: share of the token slots routed to expert i, P_i: its mean score), taken per
sequence as DeepSeek-V3's complementary loss is and averaged: a sequence's loss does not depend on which
data-parallel rank holds it, so ranks match one process. Its gradient rides on the block's output
(`attach_aux_loss`); the loss the runner reports is the language model's.

Under expert parallelism (torchtitan's and Megatron-Core's layout) the routed experts' weights are DTensors sharded
by expert over the ep ranks; each rank sorts its tokens by expert, sends each expert's to the rank holding it
(all-to-all, "dispatch"), runs its experts on what it received, and sends the outputs back ("combine").
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from ..specs.model import ModelSpec

__all__ = [
    "MoE",
    "Experts",
    "Router",
    "grouped_mm",
    "expert_parallel",
    "moe_modules",
    "attach_aux_loss",
]

INIT_STD = 0.02
"""GPT-2's initialisation, as the dense layers get (toolkit.program.model)."""


class Router(nn.Module):
    """Scores of every expert for each token, and each token's top-k experts with their weights."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.k, self.sigmoid = spec.experts_per_token, spec.router == "sigmoid"
        self.gate = nn.Linear(spec.hidden, spec.experts, bias=spec.router_bias)
        if self.sigmoid:  # DeepSeek-V3: added to the scores to pick experts, not to weight them
            self.register_buffer("balance_bias", torch.zeros(spec.experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor):
        """x (tokens, hidden) -> (weights (tokens, k) fp32, experts (tokens, k), scores (tokens, experts) fp32)."""
        logits = self.gate(x).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        pick = scores + self.balance_bias if self.sigmoid else scores
        chosen = pick.topk(self.k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.k > 1:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen, scores


class Experts(nn.Module):
    """The routed experts of one block as grouped weights (experts, in, out): one SwiGLU or GELU MLP each. Under
    expert parallelism each rank holds its experts' slice (DTensors sharded on dimension 0)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        e, h, f = spec.experts, spec.hidden, spec.expert_ffn_
        self.swiglu = spec.mlp == "swiglu"
        self.up = nn.Parameter(torch.randn(e, h, f) * INIT_STD)
        self.gate = nn.Parameter(torch.randn(e, h, f) * INIT_STD) if self.swiglu else None
        self.down = nn.Parameter(torch.randn(e, f, h) * INIT_STD)
        bias = spec.expert_bias
        self.up_bias = nn.Parameter(torch.zeros(e, f)) if bias else None
        self.gate_bias = nn.Parameter(torch.zeros(e, f)) if bias and self.swiglu else None
        self.down_bias = nn.Parameter(torch.zeros(e, h)) if bias else None

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x (rows, hidden) sorted by local expert, `counts` rows each -> (rows, hidden)."""
        up = _with_bias(grouped_mm(x, _local(self.up), counts), self.up_bias, counts)
        if self.swiglu:
            gate = _with_bias(grouped_mm(x, _local(self.gate), counts), self.gate_bias, counts)
            inner = F.silu(gate) * up
        else:
            inner = F.gelu(up, approximate="tanh")
        return _with_bias(grouped_mm(inner, _local(self.down), counts), self.down_bias, counts)


def _local(param):
    """A parameter's local tensor (its expert-parallel slice), or None."""
    if param is None:
        return None
    return param.to_local() if hasattr(param, "to_local") else param


def _with_bias(y: torch.Tensor, bias, counts: list[int]) -> torch.Tensor:
    if bias is None:
        return y
    per_row = torch.tensor(counts, device=y.device)
    return y + _local(bias).to(y.dtype).repeat_interleave(per_row, dim=0, output_size=y.shape[0])


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each expert's rows of x (sorted by expert, `counts` each) times its matrix weight[e]: one grouped GEMM, whose
    backward makes the weight's gradient as one (experts, in, out) tensor (indexing weight[e] in autograd would
    make a whole-sized zero gradient per expert). Under autocast both run in its dtype, as a linear layer does."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return _GroupedMatmul.apply(x.to(dtype), weight.to(dtype), tuple(counts))
    return _GroupedMatmul.apply(x, weight, tuple(counts))


class _GroupedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, counts):
        ctx.save_for_backward(x, weight)
        ctx.counts = counts
        out = x.new_empty(x.shape[0], weight.shape[-1])
        for e, (rows, into) in enumerate(zip(x.split(counts), out.split(counts))):
            torch.mm(rows, weight[e], out=into)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        counts, grad = ctx.counts, grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.new_empty(x.shape)
            for e, (g, into) in enumerate(zip(grad.split(counts), grad_x.split(counts))):
                torch.mm(g, weight[e].t(), out=into)
        if ctx.needs_input_grad[1]:
            grad_w = torch.empty_like(weight)
            for e, (rows, g) in enumerate(zip(x.split(counts), grad.split(counts))):
                torch.mm(rows.t(), g, out=grad_w[e])
        return grad_x, grad_w, None


class MoE(nn.Module):
    """A block's MLP as a Mixture of Experts: router, routed experts, shared experts (with Qwen2-MoE's gate)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.router = Router(spec)
        self.experts = Experts(spec)
        self.shared = None
        if spec.shared_experts:  # the shared experts as one MLP of their summed width
            width = spec.shared_experts * spec.shared_expert_ffn_
            self.shared = _SharedMLP(spec.hidden, width, spec.mlp == "swiglu")
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.ep_group, self.ep_size, self.ep_rank = None, 1, 0
        self.tp_group, self.tp_size, self.tp_rank = None, 1, 0
        self.edp_group = None
        """The experts' data-parallel group (ranks holding the same experts), set with expert parallelism."""
        """Set where ep spans tensor-parallel ranks (Megatron-Core's folding): each tp rank routes its share of the
        sequences and the outputs are gathered back (toolkit.program.moe.expert_parallel)."""
        self.aux = None
        self.loads: list[float] = []
        """Rows this rank's experts took per call over the mean share (tokens · k): what the runner records as the
        routing's load on this rank (1 without expert parallelism)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:  # folded over tp: this rank's sequences only, gathered back after
            mine = _SplitRows.apply(x, self.tp_group, self.tp_rank, self.tp_size)
            return _GatherRows.apply(self._tokens(mine), self.tp_group, self.tp_rank, self.tp_size)
        return self._tokens(x)

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        flat = x.reshape(-1, hidden)
        weights, chosen, scores = self.router(flat)
        # (folded over tp, this rank's sequences' share of the micro-batch's mean: the tp ranks' gradients add up)
        self.aux = balance_loss(scores, chosen, batch, seq) if self.training else None
        if self.aux is not None and self.tp_size > 1:
            self.aux = self.aux / self.tp_size
        out = self._routed(flat, weights, chosen)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(batch, seq, hidden)

    def _routed(self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Every token's k experts' outputs, weighted and summed: sort the token slots by expert, run the experts
        (on their ranks), put the outputs back in slot order."""
        k, experts = chosen.shape[1], self.spec.experts
        slots = chosen.flatten()
        order = slots.argsort(stable=True)
        counts = expert_counts(slots, experts)
        rows = flat[order // k]
        if self.ep_size > 1:
            out = _dispatch_run_combine(self, rows, counts)
        else:
            out = self.experts(rows, counts)
        back = out[order.argsort()]  # slot order again (a gather keeps only its indices for backward)
        return (back.view(-1, k, flat.shape[-1]) * weights.to(out.dtype).unsqueeze(-1)).sum(dim=1)


class _SharedMLP(nn.Module):
    def __init__(self, hidden: int, width: int, swiglu: bool):
        super().__init__()
        self.up = nn.Linear(hidden, width, bias=False)
        self.gate = nn.Linear(hidden, width, bias=False) if swiglu else None
        self.down = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def expert_counts(slots: torch.Tensor, experts: int) -> list[int]:
    """Token slots routed to each expert. The tracer's fake tensors have no values: there every expert takes an even
    share (what the estimate prices at a load of 1), so that the traced program has the shapes of a balanced step."""
    if _is_fake(slots):
        share, extra = divmod(slots.numel(), experts)
        return [share + (e < extra) for e in range(experts)]
    return torch.bincount(slots, minlength=experts).tolist()


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def balance_loss(scores: torch.Tensor, chosen: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """Switch Transformer's balancing loss per sequence, averaged: experts · Σ_i f_i · P_i, 1 when balanced."""
    experts, k = scores.shape[-1], chosen.shape[-1]
    picked = F.one_hot(chosen.view(batch, seq * k), experts).float().mean(dim=1)  # f_i per sequence
    mean_score = scores.view(batch, seq, experts).mean(dim=1)  # P_i per sequence
    return experts * (picked * mean_score).sum(dim=-1).mean()


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its gradient is the reverse all-to-all, times `grad_scale`."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group, grad_scale: float = 1.0):
        import torch.distributed as dist

        ctx.splits, ctx.group, ctx.grad_scale = (out_splits, in_splits), group, grad_scale
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        if ctx.grad_scale != 1.0:
            back.mul_(ctx.grad_scale)
        return back, None, None, None, None


def _arrivals(moe: MoE, counts: list[int], device: torch.device) -> list[list[int]]:
    """[source rank][local expert]: the rows each ep rank sends to this rank's experts (an all-to-all of the counts,
    on the rows' device: NCCL moves device tensors only; on the tracer's fake process group, the even share every
    rank sends)."""
    import torch.distributed as dist

    ranks, local = moe.ep_size, moe.spec.experts // moe.ep_size
    mine = counts[moe.ep_rank * local : (moe.ep_rank + 1) * local]
    sent = torch.tensor(counts, dtype=torch.long, device=device)
    if _is_fake(sent):
        return [list(mine) for _ in range(ranks)]
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=moe.ep_group)
    return received.view(ranks, local).tolist()


def _dispatch_run_combine(moe: MoE, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Expert parallelism: send each expert's rows to its rank, run this rank's experts on what arrived (regrouped
    by expert), send the outputs back. `counts`: rows per expert (all experts), in expert order."""
    ranks, local = moe.ep_size, moe.spec.experts // moe.ep_size
    table = _arrivals(moe, counts, rows.device)
    send = [sum(counts[r * local : (r + 1) * local]) for r in range(ranks)]
    arrive = [sum(row) for row in table]
    moe.loads.append(sum(arrive) / max(sum(counts), 1))
    # an expert's gradient sums what every ep rank's tokens give it, where one process averages them: the combine's
    # backward brings the gradients in at 1 / ep and the dispatch's takes them out at ep again, so the experts
    # get the mean over the ep ranks and everything before them its own gradient (powers of two: exact); the
    # experts' data-parallel group then averages as every replica does
    inputs = _AllToAll.apply(rows, arrive, send, moe.ep_group, float(ranks))
    # what arrived is ordered by source rank, then expert: regroup it by expert for the grouped weights
    starts, at = [], 0
    for row in table:
        starts.append([at + sum(row[:e]) for e in range(local)])
        at += sum(row)
    pieces = [range(starts[q][e], starts[q][e] + table[q][e]) for e in range(local) for q in range(ranks)]
    index = torch.tensor([i for piece in pieces for i in piece], dtype=torch.long, device=rows.device)
    outputs = moe.experts(inputs[index], [sum(table[q][e] for q in range(ranks)) for e in range(local)])
    return _AllToAll.apply(outputs[index.argsort()], send, arrive, moe.ep_group, 1.0 / ranks)


class _SplitRows(torch.autograd.Function):
    """This tensor-parallel rank's share of the sequences (dimension 0) of x, which every tp rank holds whole; its
    gradient is every rank's share gathered (Megatron's scatter-to-model-parallel-region)."""

    @staticmethod
    def forward(ctx, x, group, rank: int, size: int):
        ctx.group, ctx.size = group, size
        return x.chunk(size, dim=0)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_rows(grad, ctx.group, ctx.size), None, None, None


class _GatherRows(torch.autograd.Function):
    """Every tensor-parallel rank's sequences gathered (dimension 0); the gradient keeps this rank's share, as every
    rank goes on with the same whole tensor (Megatron's gather-from-model-parallel-region)."""

    @staticmethod
    def forward(ctx, x, group, rank: int, size: int):
        ctx.rank, ctx.size = rank, size
        return _all_gather_rows(x, group, size)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=0)[ctx.rank].contiguous(), None, None, None


def _all_gather_rows(x: torch.Tensor, group, size: int) -> torch.Tensor:
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def moe_modules(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def expert_parallel(model: nn.Module, ep_mesh, tp_mesh=None, edp_mesh=None) -> None:
    """Keep this rank's experts / ep of every block's routed experts, as DTensors sharded by expert over `ep_mesh`
    (the whole model was built first with the run's seed: each rank's slice is one process's). `tp_mesh`: ep spans
    these tensor-parallel ranks (Megatron-Core's folding), so each routes its share of the sequences. `edp_mesh`:
    the ranks holding the same experts, over which the runner averages their gradients."""
    from torch.distributed.tensor import Shard, distribute_tensor

    for moe in moe_modules(model):
        moe.ep_group, moe.ep_size, moe.ep_rank = ep_mesh.get_group(), ep_mesh.size(), ep_mesh.get_local_rank()
        moe.edp_group = edp_mesh.get_group() if edp_mesh is not None else None
        if tp_mesh is not None and tp_mesh.size() > 1:
            moe.tp_group, moe.tp_size, moe.tp_rank = tp_mesh.get_group(), tp_mesh.size(), tp_mesh.get_local_rank()
        for name, param in list(moe.experts.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), ep_mesh, [Shard(0)])
            setattr(moe.experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))


_AUX_SCALE = [1.0]
"""What the loss's gradient is scaled by in the backward under way (toolkit.program.build: 1 / accumulation, times
fp16's loss scale): the balancing losses' gradient is scaled alike."""


@contextlib.contextmanager
def aux_loss_scale(scale: float):
    """Run a backward whose loss was scaled by `scale` (Megatron-Core's MoEAuxLossAutoScaler.set_loss_scale)."""
    _AUX_SCALE[0] = scale
    try:
        yield
    finally:
        _AUX_SCALE[0] = 1.0


class _AuxGradient(torch.autograd.Function):
    """Passes x through; in backward also gives `aux` the gradient coefficient × the loss's scale (Megatron-Core's
    MoEAuxLossAutoScaler). The balancing loss then trains where the block runs its backward: inside a
    checkpointed block (no early recompute of every block for it), on any pipeline stage (which returns
    activations, not a loss; torch's schedule scales its gradients by 1 / micro-batches afterwards), and the
    reported loss stays the language model's."""

    @staticmethod
    def forward(ctx, x, aux, coefficient: float):
        ctx.save_for_backward(aux)
        ctx.coefficient = coefficient
        return x

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.coefficient * _AUX_SCALE[0]), None


def attach_aux_loss(x: torch.Tensor, aux: torch.Tensor | None, coefficient: float) -> torch.Tensor:
    """x, carrying `aux`'s gradient (coefficient × the loss's scale) back with its own."""
    if aux is None or not coefficient or not torch.is_grad_enabled():
        return x
    return _AuxGradient.apply(x, aux, coefficient)
