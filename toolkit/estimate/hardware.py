"""What the step-time model knows of a device: the figures no datasheet gives (Assumptions), the device's own figures
(Hardware: peaks, bandwidths, its links and network, its kernel profile) and how a job's catalog row and offer give
them (hardware_for, network_figure)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..specs.catalog import Catalog
from ..specs.errors import SpecError
from ..specs.job import Job, compute_dtype
from .kernels import KernelProfile, kernel_profile

__all__ = [
    "Assumptions",
    "Hardware",
    "hardware_for",
    "network_figure",
    "node_network_bytes_per_s",
    "ASSUMED_NETWORK_BITS_PER_DEVICE",
]


@dataclass(frozen=True)
class Assumptions:
    """Figures no datasheet gives; each is a knob, and the benchmark says how well they hold."""

    gemm_fraction: float = 0.70
    """Share of dense peak a large matmul reaches in a real training step. Chosen once, on Megatron's 1T run
    (Korthikanti et al. 2022, Table 5: tp 8, pp 64, selective recompute and sequence parallelism, fp16,
    dropout 0.1, A100: 71.49 s) while the model still spread the output projection over all stages; with the
    projection on the last stage that run comes out 6 % slow, and raising the fraction to fit it would make
    the rest of the measured runs faster than measured (benchmarks/steptime_accuracy.py)."""
    link_efficiency: float = 0.8
    """Share of the intra-node link's nominal one-way bandwidth a ring collective achieves. Assumed, and checked
    against nccl-tests' bus bandwidth inside one node (tests/estimate/test_collectives.py: published runs)."""
    network_efficiency: float = 0.9
    """Share of the NICs' nominal bandwidth a collective across nodes achieves. Assumed, and checked against
    nccl-tests' bus bandwidth over InfiniBand (tests/estimate/test_collectives.py: published runs)."""
    latency_intra_s: float = 2e-6
    """Per-hop latency of a ring inside a node. Assumed (an 8-device all-reduce starts in ~30 µs)."""
    latency_inter_s: float = 10e-6
    """Latency of a hop between nodes (a ring's, or a tree's level). Assumed."""
    pcie_bytes_per_s: float = 25e9
    """Host <-> device copies for offload where the catalog gives no host link. Assumed: PCIe 4.0 x16's 32 GB/s one
    way, at about 80 % achieved."""
    host_link_efficiency: float = 0.8
    """Share of the catalog's host link (PCIe, one way, nominal) an offload copy achieves. Assumed."""
    host_adam_params_per_s: float = 1e9
    """Parameters a host CPU steps with Adam per second per device. Assumed: DeepSpeed's CPU-Adam's order of
    magnitude."""
    bucket_bytes: float = 25 * 2**20
    """DDP gradient bucket (torch's default 25 MB); the runner's training.bucket_cap_mb sets it."""
    attention_fraction: float | None = None
    """Share of peak a fused (flash) attention kernel reaches; None = gemm_fraction. Measured by calibrate
    (a CPU's flash kernel runs far below its matmuls)."""
    optimizer_params_per_s: float | None = None
    """Parameters the device's optimizer steps per second; None = its states' bytes at memory bandwidth (a GPU's
    step is bound by them; a CPU's by its arithmetic, which calibrate measures)."""
    comm_overlaps_compute: bool = True
    """Collectives run beside compute (a GPU's copy engines and NCCL's own SMs). On a CPU the same cores do both,
    so nothing hides: calibrate sets it false there."""
    reduce_scatter_bw_bytes_per_s: float | None = None
    """Bus bandwidth of a reduce-scatter where it differs from the link's (measured by calibrate: gloo's is a
    fraction of its all-reduce's); None = the link's. ZeRO-2/3's gradient reduction."""
    gather_bw_bytes_per_s: float | None = None
    """Bus bandwidth of an all-gather where it differs from the link's; None = the link's. ZeRO's parameter
    gathers."""
    tp_collective_s: float | None = None
    """Fixed cost of one tensor-parallel collective as the program issues it: its latency and, under torch's
    DTensor, the dispatch and redistribution of the layer around it; None = the ring's latency. `toolkit
    calibrate` measures it for tensor-parallel jobs (on a 2-core CPU about 1 ms: a rank's collective often waits
    for its peer's thread to be scheduled)."""
    fsdp_collective_s: float | None = None
    """Cost of one FSDP2 collective (a block's gather or reduce-scatter) beyond its ring bytes, as the program
    issues it: its latency and, on a CPU, the fresh buffers, the copies in and out and the hooks around it; None =
    the ring's latency. `toolkit calibrate` measures it for FSDP2 jobs (2 gloo ranks on 2 cores: about 2 ms)."""
    checkpoint_overhead_s: float = 0.0
    """Fixed cost of one checkpointed region's recompute beyond its ops (torch's checkpoint: its frame, the
    saved-tensor hooks, the early stop raised and unwound through autograd), per region per micro-batch. 0 for
    catalog accelerators, whose kernels hide the host's work; `toolkit calibrate` measures it on the job's own
    region (a CPU, a 256-wide block: about 1 ms, a third of that block's forward)."""
    selective_op_overhead_s: float = 0.0
    """What a per-op-recompute region (selective-op) costs beyond checkpoint_overhead_s, per region per
    micro-batch: torch's selective checkpoint runs each of the region's tensor operations, forward and recompute,
    through a Python dispatch mode. 0 for catalog accelerators; `toolkit calibrate` measures it on the job's block
    (a CPU, a 256-wide block: ~1 ms, about what the recompute it skips would cost)."""
    op_overhead_s: float = 0.0
    """Fixed cost of one tensor operation (dispatch, autograd, a kernel launch). 0 for catalog accelerators, whose
    asynchronous launches hide behind the previous kernel at training sizes; `toolkit calibrate` measures it where
    it shows (a CPU: ~2 µs, far above a small model's kernels)."""
    gemm_half_size: float = 0.0
    """A matrix dimension at which a product runs at half its large-matrix rate, for each of its three dimensions:
    the rate falls as x / (x + gemm_half_size) in each (every pass over a thin dimension pays a fixed cost of
    packing, loop set-up and partial tiles). 0 for catalog accelerators, at whose training shapes (thousands of
    tokens a micro-batch, thousands wide) tiles are full; `toolkit calibrate` measures it (this 2-core CPU:
    16-40 by threads and load; a product 128 wide runs at 88 % of one 256 wide, one 32 wide at 54 %)."""
    inference_op_overhead_s: float | None = None
    """Fixed cost of one tensor operation of a decode step (no autograd; with the module calls and the Python between
    operations); None = op_overhead_s. `toolkit calibrate` measures it on the job's kind of block at tiny widths
    (this 2-core CPU: about 5 µs)."""
    decode_bw_bytes_per_s: float | None = None
    """Weight bytes per second a decode step's products stream (few rows each, every layer's matrices in turn: on
    a CPU, what its caches keep of them decides); None = the memory bandwidth. `toolkit calibrate` measures it on
    the job's block matrices at its concurrency."""
    serve_host_s_per_step: float | None = None
    """`toolkit generate --serve`'s host work a step (its engine loop and queues), measured by `toolkit calibrate`
    on a serving job with the model taken out (toolkit.calibrate.serve_host); None elsewhere."""
    serve_host_s_per_token: float | None = None
    """The same server's host work for each token a step streams beyond the first (a queue, a JSON line, a write)."""
    serve_host_s_per_request: float | None = None
    """The same server's host work before a request's first step (reading it, queueing it)."""
    ops_per_unit: float = 1.0
    """Tensor operations one op unit (`op_units`) stands for: a block's forward op and its backward run several
    (a linear's forward a transpose and a product, its backward two products, a sum and the gradient's add).
    `toolkit calibrate` counts them in the job's own model (the runner's GPT: about 3)."""


@dataclass(frozen=True)
class Hardware:
    peak_flops: float
    """Dense peak of the compute dtype, FLOP/s: what MFU divides by."""
    memory_bw_bytes_per_s: float
    intra_bw_bytes_per_s: float
    """Per device, one direction, inside a node."""
    inter_bw_bytes_per_s: float
    """Per device, one direction, across nodes: the node's network divided among its devices."""
    gpus_per_node: int
    matmul_peak_flops: float | None = None
    """Peak the matmuls run at when it differs (FP8 matmuls with bf16 everything else); None = peak_flops."""
    assumptions: Assumptions | None = None
    """Figures measured on this device (its catalog row's `assumptions`), used in place of the defaults."""
    allreduce_bus_bw_bytes_per_s: float | None = None
    """An all-reduce's bus bandwidth inside a node where the switch reduces (NVLink SHARP); None = the link's."""
    host_bw_bytes_per_s: float | None = None
    """The host link one way, nominal (the catalog's PCIe figure); None = the assumption pcie_bytes_per_s."""
    kernels: KernelProfile | None = None
    """What the device's kernels achieve (toolkit/data/kernels.yaml), for a catalog GPU that has a profile and no
    measured figures of its own; memory_bw_bytes_per_s is then the achieved bandwidth."""
    step_scale: float = 1.0
    """A measured step's ratio to the modelled one on this accelerator (its catalog row's step_calibration): every
    modelled step is multiplied by it."""
    communication_scale: float | None = None
    """With two or more measured layouts: the collectives' own scale (step_calibration's communication_scale);
    step_scale then scales the rest."""

    @property
    def gemm_peak(self) -> float:
        return self.matmul_peak_flops or self.peak_flops


ASSUMED_NETWORK_BITS_PER_DEVICE = 200e9
"""Across nodes when neither the job nor its offer gives a figure: one 200 Gb/s HDR InfiniBand adapter per
device, as in a DGX A100 (8 × 200 Gb/s for 8 GPUs, NVIDIA DGX A100 datasheet). An assumption, said in the notes."""


def node_network_bytes_per_s(job: Job, catalog: Catalog) -> float | None:
    """A node's network, bytes/s one way: cluster.inter_node_bw_bytes_per_s, else the offer's; None if neither."""
    if job.cluster.inter_node_bw_bytes_per_s is not None:
        return job.cluster.inter_node_bw_bytes_per_s
    return catalog.offer(job.cost.offer).network_bw_bytes_per_s if job.cost.offer else None


def network_figure(job: Job, catalog: Catalog) -> tuple[float, str]:
    """(a node's network in bytes/s one way, where the figure comes from): the job's or its offer's; else the
    accelerator's reference system (its catalog row: DGX A100, DGX H100); else the stated assumption."""
    given = node_network_bytes_per_s(job, catalog)
    if given is not None:
        return given, "given"
    acc = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    if acc is not None and acc.network_bits_per_s_per_device:
        return acc.network_bits_per_s_per_device / 8 * job.cluster.gpus_per_node, "accelerator"
    return ASSUMED_NETWORK_BITS_PER_DEVICE / 8 * job.cluster.gpus_per_node, "assumed"


def hardware_for(job: Job, catalog: Catalog) -> Hardware | None:
    """The figures of a resolved job's accelerator, links and network; None when a figure is unknown."""
    if not job.cluster.accelerator:
        return None
    acc = catalog.accelerator(job.cluster.accelerator)
    peak = acc.peak_flops(compute_dtype(job.precision.mode))
    cl = job.cluster
    intra = cl.intra_node_bw_bytes_per_s or (acc.link_bw_bytes_per_s / 2 if acc.link_bw_bytes_per_s else None)
    if intra is None and cl.count == 1:
        intra = float("inf")  # one device sends nothing: an unknown link does not matter
    node_net, _where = network_figure(job, catalog)
    if peak is None or acc.memory_bw_bytes_per_s is None or intra is None:
        return None
    fp8 = acc.peak_flops("fp8") if job.precision.fp8 else None
    measured, kernels = None, None
    if not acc.assumptions:
        kernels = kernel_profile(acc.name)
    if acc.assumptions:
        known = {f.name for f in dataclasses.fields(Assumptions)}
        wrong = sorted(set(acc.assumptions) - known)
        if wrong:
            raise SpecError(
                f"{acc.name}.assumptions.{wrong[0]}",
                acc.assumptions[wrong[0]],
                f"unknown figure; allowed: {', '.join(sorted(known))}",
            )
        measured = dataclasses.replace(Assumptions(), **acc.assumptions)
    memory_bw = acc.memory_bw_bytes_per_s * (kernels.memory_fraction if kernels else 1.0)
    return Hardware(
        peak_flops=peak,
        memory_bw_bytes_per_s=memory_bw,
        intra_bw_bytes_per_s=intra,
        inter_bw_bytes_per_s=node_net / cl.gpus_per_node,
        gpus_per_node=cl.gpus_per_node,
        matmul_peak_flops=fp8,
        assumptions=measured,
        kernels=kernels,
        allreduce_bus_bw_bytes_per_s=None if cl.intra_node_bw_bytes_per_s else acc.allreduce_bus_bw_bytes_per_s,
        host_bw_bytes_per_s=acc.host_link_bytes_per_s,
        step_scale=float((acc.step_calibration or {}).get("scale", 1.0)),
        communication_scale=(acc.step_calibration or {}).get("communication_scale"),
    )
