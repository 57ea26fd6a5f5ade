"""A Mixture of Experts in the estimate: what expert parallelism leaves on a device, how wide the experts' work is,
how unevenly it falls on ranks, and the all-to-all that carries tokens to their experts and back.

    device_counts(model, ep)       # parameters as one rank of an expert-parallel group holds them
    activation_width(job, load)    # the MLP width a dense block would need for the same per-token work
    expert_load(model, ep)         # the busiest rank's expert rows over an even share (imbalance or capacity)
    all_to_all_s(bytes, ep, stride, hw, a)

The layout is Megatron-Core's and torchtitan's: ep ranks inside the data-parallel group share out each block's
routed experts, which dp / ep ranks (the experts' own data-parallel group) replicate; attention, norms, the router
and the shared experts stay replicated over dp. Experts are whole on every tensor-parallel rank (tensor
parallelism splits the attention only), so they do the same work on each rank of a tensor-parallel group.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..specs.backends import is_megatron
from ..specs.dims import experts_folded
from ..specs.model import ModelSpec
from ..specs.params import ParamCount, count_params, mlp_params, moe_params
from .collectives import bus_bw_bytes_per_s, placement, ring_s

__all__ = [
    "ExpertGrid",
    "FP8_DISPATCH_BYTES",
    "remote_nodes",
    "deepep_s",
    "deepep_low_latency_s",
    "DEEPEP_LOW_LATENCY_GBPS",
    "allgather_dispatch_s",
    "expert_grid",
    "AUX_LOSS_IMBALANCE",
    "LOSS_FREE_IMBALANCE",
    "GROUPED_GEMM_HALF_ROWS",
    "activation_width",
    "active_width",
    "all_to_all_s",
    "dense_block_params",
    "device_counts",
    "down_params",
    "expert_load",
    "expert_rows",
    "imbalance",
    "imbalance_for_load",
    "is_moe",
    "mlp_width",
    "moe_temp_width",
    "routed_per_device",
]

AUX_LOSS_IMBALANCE = 1.52
"""Busiest expert's tokens over the mean, softmax routing trained with an auxiliary balancing loss: Wang et al. 2024,
"Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts" (arXiv 2408.15664), Table 2: MaxVio_global 0.52
for the 3B model (0.72 at 1B; MaxVio = max load / mean load - 1)."""
LOSS_FREE_IMBALANCE = 1.04
"""The same with DeepSeek-V3's auxiliary-loss-free bias (sigmoid routing): Table 2, MaxVio_global 0.04 (1B and
3B)."""
GROUPED_GEMM_HALF_ROWS = 128.0
"""Rows per expert at which a grouped GEMM runs at half its large-matrix rate (the rate falls as m / (m + 128)):
fitted to DeepGEMM's masked grouped GEMM on H800 (README, 2025-04: 1,024 / 512 / 256 rows per group reach 0.92 /
0.77 / 0.69 of the 8,192-row rate at N 4,096, K 7,168; 0.76 / 0.75 / 0.67 at N 7,168, K 2,048)."""


def is_moe(model: ModelSpec) -> bool:
    return bool(model.has_shape and model.experts)


def imbalance(model: ModelSpec) -> float:
    """The busiest expert's load over the mean: the model's expert_imbalance, else the sourced figure for the router
    (sigmoid routing is DeepSeek-V3's loss-free balancing; softmax routing balances with an auxiliary loss)."""
    if model.expert_imbalance is not None:
        return model.expert_imbalance
    return LOSS_FREE_IMBALANCE if model.router == "sigmoid" else AUX_LOSS_IMBALANCE


@dataclasses.dataclass(frozen=True)
class ExpertGrid:
    """Where a layout's routed experts live and which tokens each rank sends them (arrays over layouts allowed).

    Plain (the runner's program: ep inside dp's shard group, etp 1, torch's backend): the experts are whole on
    every tensor-parallel rank, each of which routes all of its replica's tokens; ep ranks are tp · cp apart.
    Grid (Megatron-Core always, and any layout whose ep spans tensor- or context-parallel ranks or splits the
    experts, etp > 1: its MoE parallel folding): the stage's tp · cp · dp ranks hold etp × ep × edp, each rank
    sends its tensor-parallel share of the tokens (sequence parallelism), ep ranks are etp apart, and each
    expert's matrices split over etp ranks that gather their tokens (same FLOPs a rank, rows × etp)."""

    folded: object
    """The grid's program (bool array)."""
    token_split: object
    """How many ways a rank's tokens split before dispatch: tp on the grid, 1 plain."""
    experts_split: object
    """How many ways a block's routed experts split over ranks: ep · etp."""
    edp: object
    """Ranks holding the same experts: ZeRO's shard group for them and their gradient reduction."""
    stride: object
    """Global ranks between two ep ranks: tp · cp plain, etp on the grid."""


def expert_grid(job) -> ExpertGrid:
    par = job.parallel
    tp, cp, ep, etp = (np.asarray(v) for v in (par.tp, par.cp, par.ep, par.etp))
    shard = np.maximum(np.asarray(1 if par.dp is None else par.dp) * cp // np.asarray(par.dp_replicate), 1)
    folded = experts_folded(par, is_megatron(job))
    return ExpertGrid(
        folded=folded,
        token_split=np.where(folded, tp, 1),
        experts_split=ep * etp,
        edp=np.where(folded, np.maximum(shard * tp // (ep * etp), 1), np.maximum(shard // ep, 1)),
        stride=np.where(folded, etp, tp * cp),
    )


FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128
"""Bytes a value takes in an FP8 dispatch: e4m3 plus an fp32 scale per 128 values (DeepSeek-V3 §3.3, DeepEP)."""


def remote_nodes(model: ModelSpec, nodes):
    """Other nodes one token's experts lie on, expected over even routing: each of the k experts on one of the
    group's nodes, at most model.max_nodes_per_token of them (node-limited routing) (arrays allowed)."""
    nodes = np.asarray(nodes, dtype=float)
    distinct = nodes * (1 - (1 - 1 / nodes) ** model.experts_per_token)
    if model.max_nodes_per_token:
        distinct = np.minimum(distinct, model.max_nodes_per_token)
    return distinct * (nodes - 1) / nodes


def deepep_s(size_bytes, n, stride, hw, a, model: ModelSpec):
    """One DeepEP dispatch or combine over n ranks `stride` apart, `size_bytes` being a rank's k copies of its
    tokens: each token crosses the network once per other node holding its experts (remote_nodes) while the copies
    for its own node's GPUs cross NVLink; both links run at once. The forwarding inside the receiving node is
    assumed hidden behind the network leg (DeepEP's normal kernels reach 43-58 GB/s of a 50 GB/s NIC across nodes
    and 153-158 GB/s of NVLink inside one on H800, its README; tests/estimate/test_moe.py holds the model to both)."""
    n = np.asarray(n, dtype=float)
    per_node, nodes = placement(n, stride, hw.gpus_per_node)
    token_bytes = size_bytes / model.experts_per_token
    inside = size_bytes * (per_node - 1) / np.maximum(n, 1) / (hw.intra_bw_bytes_per_s * a.link_efficiency)
    outside = (
        token_bytes * remote_nodes(model, nodes) / (hw.inter_bw_bytes_per_s * a.network_efficiency)
        if hw.inter_bw_bytes_per_s
        else 0.0
    )
    return np.where(n > 1, np.maximum(inside, outside) + a.latency_inter_s, 0.0)


DEEPEP_LOW_LATENCY_GBPS = {
    "ep": (8, 16, 32, 64, 128, 256),
    "dispatch": (98, 63, 48, 43, 39, 39),
    "combine": (127, 74, 53, 46, 39, 40),
}
"""DeepEP's low-latency (pure RDMA) kernels, the decode path SGLang and vLLM run across nodes: the bandwidth each
reaches by expert-parallel size on H800 with one 400 Gb/s CX7 NIC (~50 GB/s) a GPU, at 128 tokens a rank, hidden
7,168, top-8, FP8 dispatch and BF16 combine (deepseek-ai/DeepEP README, "Low-latency kernels with pure RDMA":
77/118/155/173/192/194 µs to dispatch and 114/195/273/314/369/360 µs to combine)."""

DEEPEP_NIC_BYTES_PER_S = 50e9
"""The NIC behind DEEPEP_LOW_LATENCY_GBPS (400 Gb/s CX7, "~50 GB/s maximum bandwidth", the same README)."""


def deepep_low_latency_s(copy_bytes, ep, hw, kind: str):
    """One low-latency dispatch or combine moving `copy_bytes` (a rank's tokens × top-k × hidden × element bytes) at
    the bandwidth DeepEP measured for this expert-parallel size, scaled by this cluster's NIC over the README's (its
    timings include the network hop)."""
    table = DEEPEP_LOW_LATENCY_GBPS
    gbps = np.interp(np.log2(np.asarray(ep, dtype=float)), np.log2(table["ep"]), table[kind])
    nic = hw.inter_bw_bytes_per_s or DEEPEP_NIC_BYTES_PER_S
    return copy_bytes / (gbps * 1e9 * nic / DEEPEP_NIC_BYTES_PER_S)


def allgather_dispatch_s(token_bytes, n, stride, hw, a):
    """Megatron's allgather dispatcher, one way: every rank gathers the group's tokens (each `token_bytes`) and
    keeps its experts' rows; the combine is the matching reduce-scatter (a ring at the group's bus bandwidth)."""
    return ring_s(1.0, token_bytes * np.asarray(n), n, bus_bw_bytes_per_s(n, stride, hw, a, kind="all_gather"))


def expert_load(model: ModelSpec, ep=1, *, for_memory: bool = False):
    """The busiest rank's expert rows over an even share (tokens · k / ep each). One rank holding every expert
    takes exactly its tokens' k slots (1); one expert a rank takes the busiest expert's load (`imbalance`); in
    between, assumed linear in (ep - 1) / (experts - 1), a rank's several experts averaging some of it out.
    A capacity factor drops what an expert takes beyond it, so the work is at most that; the buffers a
    capacity-bound kernel allocates are the capacity itself (for_memory), whatever the routing."""
    ep = np.asarray(ep, dtype=float)
    spread = (ep - 1) / max(model.experts - 1, 1)
    load = 1 + (imbalance(model) - 1) * spread
    if model.capacity_factor is None:
        return load
    return np.full_like(load, model.capacity_factor) if for_memory else np.minimum(load, model.capacity_factor)


def imbalance_for_load(model: ModelSpec, ep: int, load: float) -> float:
    """The expert imbalance at which `expert_load(model, ep)` is `load` (a rank's measured one; it may be below 1,
    a rank taking less than its share)."""
    if ep <= 1 or model.experts <= 1:
        return 1.0
    return 1 + (load - 1) * (model.experts - 1) / (ep - 1)


def active_width(model: ModelSpec) -> float:
    """The MLP width one token's work fills: its top-k routed experts and the shared ones (a dense model: ffn)."""
    if not model.experts:
        return model.ffn_
    return model.experts_per_token * model.expert_ffn_ + model.shared_experts * model.shared_expert_ffn_


def activation_width(model: ModelSpec, load: float = 1.0) -> float:
    """The width of a dense MLP that would save the same activations per token as an MoE block on its busiest
    rank: k experts' rows at `load` times an even share, and the shared experts' (a dense model: ffn)."""
    if not model.experts:
        return model.ffn_
    return model.experts_per_token * model.expert_ffn_ * load + model.shared_experts * model.shared_expert_ffn_


def mlp_width(job, load: float = 1.0):
    """A block's MLP width per token on one tensor-parallel rank: ffn / tp, or an MoE block's activation_width at
    `load` (whole on every tensor-parallel rank plain; over the rank's tp share of the tokens on the experts' own
    grid, which the width carries: expert_grid)."""
    m = job.model
    if not is_moe(m):
        return m.ffn_ / np.asarray(job.parallel.tp)
    return activation_width(m, load) / expert_grid(job).token_split


def moe_temp_width(model: ModelSpec, load=1.0):
    """The width of an MoE block's routed experts' backward temporaries: their rows (k at `load`)."""
    return model.experts_per_token * model.expert_ffn_ * np.asarray(load)


def down_params(job):
    """A block's down-projection weights on one rank, whose gradient its MLP backward makes first: h · ffn / tp, or
    an MoE block's shared experts' and this rank's routed experts' (one grouped gradient)."""
    m = job.model
    if not is_moe(m):
        return m.hidden * m.ffn_ / np.asarray(job.parallel.tp)
    routed = m.experts / (np.asarray(job.parallel.ep) * job.parallel.etp) * m.expert_ffn_
    return m.hidden * (routed + m.shared_experts * m.shared_expert_ffn_)


def expert_rows(model: ModelSpec, tokens, ep):
    """Rows one local expert multiplies per micro-batch, evenly routed: the ep ranks' tokens · k / experts."""
    return np.asarray(tokens) * model.experts_per_token * np.asarray(ep) / model.experts


def dense_block_params(model: ModelSpec) -> int:
    """One dense block (DeepSeek's first blocks: a dense MLP of width ffn) of an MoE model."""
    c = count_params(model)
    mlp, _routed, _used = moe_params(model)
    return c.per_layer - mlp + mlp_params(model, model.ffn_, model.bias == "all")


def routed_per_device(model: ModelSpec, ep, moe_blocks):
    """Routed-expert parameters one rank holds over `moe_blocks` MoE blocks: 1 / ep of each block's experts."""
    if not model.experts:
        return 0.0
    return count_params(model).experts_per_layer / np.asarray(ep) * np.asarray(moe_blocks)


def device_counts(model: ModelSpec, ep=1) -> ParamCount:
    """count_params as one rank of an expert-parallel group holds them: each MoE block's routed experts 1 / ep."""
    c = count_params(model)
    if not model.experts:
        return c
    kept = c.experts_per_layer / np.asarray(ep)
    dropped = c.experts_per_layer - kept
    return dataclasses.replace(
        c,
        per_layer=c.per_layer - dropped,
        layers=c.layers - dropped * model.moe_layers,
        experts_per_layer=kept,
    )


def all_to_all_s(size_bytes, n, stride, hw, a):
    """One all-to-all over n ranks `stride` global ranks apart, each sending `size_bytes` in equal parts to every
    rank (itself included). The part for ranks on its node goes over the node's links at link_efficiency, the
    part for other nodes over its own NIC at network_efficiency (an all-to-all cannot pool a node's NICs: NCCL
    issue 267), both at once; plus a hop's latency per peer. Across nodes this is nccl-tests' alltoall bus
    bandwidth of about one NIC's rate (twice it on two nodes: NCCL issue 130), within one node the link's (DeepEP,
    H800: 153-158 GB/s of NVLink's ~160, and 43-58 GB/s over a 50 GB/s NIC)."""
    n = np.asarray(n, dtype=float)
    per_node, nodes = placement(n, stride, hw.gpus_per_node)
    inside = size_bytes * (per_node - 1) / np.maximum(n, 1) / (hw.intra_bw_bytes_per_s * a.link_efficiency)
    outside = (
        size_bytes * (n - per_node) / np.maximum(n, 1) / (hw.inter_bw_bytes_per_s * a.network_efficiency)
        if hw.inter_bw_bytes_per_s
        else 0.0
    )
    latency = (per_node - 1) * a.latency_intra_s + np.where(nodes > 1, a.latency_inter_s, 0.0)
    return np.where(n > 1, np.maximum(inside, outside) + latency, 0.0)
