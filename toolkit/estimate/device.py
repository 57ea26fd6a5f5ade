"""What a device holds beyond the program's tensors, and so whether a job really fits.

Three peaks per device (the busiest one), each the figure a different tool reports:

- allocated: the tensors the program holds at its peak (`memory.peak_bytes`; what the trace measures and
  `torch.cuda.max_memory_allocated` reports);
- reserved: what torch's caching allocator holds from the driver then (`torch.cuda.max_memory_reserved`,
  torchtitan's "memory" log): the tensors, the cuBLAS workspaces it hands out, and the cached blocks it
  cannot reuse for the next request (fragmentation);
- device: what nvidia-smi shows for the process: the reserved pool plus the CUDA context (runtime and the
  kernels it loads) and the communication library's buffers, which NCCL allocates outside torch's allocator,
  one set for every process group and pipeline neighbour the layout talks to.

Every figure below is either sourced or an assumption with its range; a catalog row's `device_memory`
replaces them with figures measured on that device. Array-capable like the rest of toolkit.estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..specs.catalog import Accelerator
from ..specs.errors import SpecError
from ..specs.job import Job

__all__ = [
    "DeviceAssumptions",
    "DeviceMemory",
    "NCCL_CONNECTION_BYTES",
    "assumptions_for",
    "comm_groups",
    "device_memory",
]

MIB, GIB = 2**20, 2**30

NCCL_CONNECTION_BYTES = 4 * MIB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
"""Receive buffers of one NCCL connection on one channel, for its three protocols: SIMPLE, NCCL_BUFFSIZE
(4 MiB by default, NCCL user guide, Environment Variables, NCCL_BUFFSIZE); LL128, 120 elements × 640 threads
× 8 steps × 8 B = 4.69 MiB; LL, 8 lines × 512 threads × 8 steps × 16 B = 0.5 MiB (NCCL_LL128_ELEMS_PER_THREAD,
NCCL_LL128_MAX_NTHREADS, NCCL_LL_LINES_PER_THREAD, NCCL_LL_MAX_NTHREADS, NCCL_STEPS in NCCL's
src/include/device.h). 9.2 MiB in all."""

HCCL_COMMUNICATOR_BYTES = 2 * 200 * MIB
"""Huawei's HCCL gives each communicator 2 × HCCL_BUFFSIZE (200 MB by default) for sending and receiving
(Ascend CANN documentation, HCCL_BUFFSIZE, checked 2026-12-01)."""


@dataclass(frozen=True)
class DeviceAssumptions:
    """The figures no datasheet gives. Defaults for an NVIDIA GPU under torch ≥ 2 (CUDA's lazy module loading);
    a catalog row's `device_memory` (e.g. measured by `toolkit calibrate` on that machine) replaces them."""

    context_bytes: float = 0.75 * GIB
    """CUDA context plus the kernels a training step loads, per process. Assumed; range 0.3–1.6 GiB: a bare
    context is ~0.3 GiB with lazy loading (CUDA's default since 12.2, and PyTorch's), and BigScience measured
    1,271 MiB on a V100-32GB and 1,573 MiB on an A100-40GB with every kernel loaded eagerly (CUDA 11, 2022;
    bigscience train/tr11-176B-ml/chronicles-prequel.md)."""
    workspace_bytes: float = 64 * MIB
    """cuBLAS/cuBLASLt workspaces torch's allocator hands out, one per (handle, stream): a few to tens of MiB
    each (PyTorch CUDA semantics notes, CUBLAS_WORKSPACE_CONFIG). Assumed for a compute and a communication
    stream; range 16–256 MiB."""
    fragmentation: float = 0.15
    """Share of the reserved pool that holds no live tensor at the peak. GMLake (Guo et al., ASPLOS 2024,
    arXiv 2401.08156) measured 15 % on average and up to 33 % over eight LLMs trained on A100-80GB with
    recompute, offload, ZeRO and LoRA under torch's caching allocator."""
    fragmentation_expandable: float = 0.03
    """The same share with `expandable_segments:True`, which grows one mapped segment instead of caching many
    (PyTorch CUDA semantics notes). Assumed; range 0–0.1 (GMLake's virtual-memory stitching, the same idea,
    leaves almost none)."""
    comm_channels: int = 16
    """Channels an NCCL collective communicator connects, ring and tree each. NVIDIA GPUs take it from their
    intra-node link (`nvlink_channels`); elsewhere assumed: NCCL picks 2–32 by topology (NCCL_MIN_NCHANNELS /
    NCCL_MAX_NCHANNELS bound it)."""
    p2p_channels: int = 2
    """Channels per pipeline peer (NCCL_NCHANNELS_PER_NET_PEER defaults to 2)."""
    communicator_bytes: float | None = None
    """Bytes one communicator holds when the library is not NCCL's design (HCCL); None = from the channels."""

    @property
    def comm_group_bytes(self) -> float:
        """One collective communicator: ring and tree connections on every channel."""
        if self.communicator_bytes is not None:
            return self.communicator_bytes
        return self.comm_channels * 2 * NCCL_CONNECTION_BYTES

    @property
    def p2p_peer_bytes(self) -> float:
        """One pipeline neighbour: a receive connection each way on its channels."""
        if self.communicator_bytes is not None:
            return self.communicator_bytes
        return self.p2p_channels * 2 * NCCL_CONNECTION_BYTES


_XLA = DeviceAssumptions(
    context_bytes=0.0, workspace_bytes=0.0, fragmentation=0.0, fragmentation_expandable=0.0, communicator_bytes=0.0
)
"""TPUs: XLA plans every buffer ahead of the step and has no caching allocator or NCCL; nothing is added."""


NCCL_MAX_CHANNELS = 32
"""NCCL's MAXCHANNELS (src/include/device.h): no communicator opens more."""
NVLINK_LINK_BYTES_PER_S = 50e9
"""One NVLink link, both directions (NVLink2, 3 and 4 alike: V100's 6 links make its 300 GB/s, A100's 12 its 600,
H100's 18 its 900)."""


def nvlink_channels(link_bytes_per_s: float) -> int:
    """The channels NCCL opens for a collective over a node's GPUs: two per NVLink link, up to its 32. Logged:
    24 on 8 × A100 SXM4 with NVSwitch (12 links; NVIDIA/nccl-tests#100, `Channel 23/24`) and on 4 × A100 with
    NVLink (NVIDIA/nccl#1785, confirmed there by an NCCL maintainer); 32 per pair on 8 × H100 (18 links;
    NVIDIA/nccl#1685); 2 over PCIe (NVIDIA/nccl-tests#228's log: channels 00 and 01 on 8 GPUs through shared
    memory). Groups that span nodes may open fewer (2 nodes of 2 H20 opened 8: NVIDIA/nccl#1189); not modelled."""
    links = link_bytes_per_s / NVLINK_LINK_BYTES_PER_S
    return int(min(NCCL_MAX_CHANNELS, max(2, 2 * links)))


def assumptions_for(accelerator: Accelerator) -> DeviceAssumptions:
    """The device terms of a catalog row: its measured `device_memory`, else the defaults of its stack."""
    vendor, base = accelerator.vendor.lower(), DeviceAssumptions()
    if vendor == "google":
        base = _XLA
    elif vendor == "huawei":
        base = DeviceAssumptions(communicator_bytes=HCCL_COMMUNICATOR_BYTES)
    elif vendor == "nvidia" and accelerator.link_bw_bytes_per_s:
        base = DeviceAssumptions(comm_channels=nvlink_channels(accelerator.link_bw_bytes_per_s))
    measured = accelerator.device_memory
    if not measured:
        return base
    known = {f.name for f in dataclasses.fields(DeviceAssumptions)}
    wrong = sorted(set(measured) - known)
    if wrong:
        raise SpecError(
            f"{accelerator.name}.device_memory.{wrong[0]}",
            measured[wrong[0]],
            f"unknown figure; allowed: {', '.join(sorted(known))}",
        )
    return dataclasses.replace(base, **measured)


def comm_groups(job: Job):
    """(collective communicators, pipeline neighbours) of the busiest rank of a resolved job (arrays allowed).

    The world group (barriers, the launcher's checks) always, when there is more than one device; then one
    for each parallel dimension larger than 1: data (with context parallelism, the dp × cp group the
    gradients reduce over), tensor, context, expert (the all-to-all's group, and the experts' data-parallel group
    their gradients reduce over); and for tied embeddings across pipeline stages, the group of the
    first and last stage that sums their gradients (Megatron's embedding group). A 1-D layout's group is the
    world group itself. Pipeline ranks talk to two neighbours (one at a plain pipeline's ends, but the first
    stage of an interleaved schedule also talks to the last).

    DeepSpeed's pipeline engine (a PipelineModule, as Megatron-DeepSpeed builds its GPT) communicates on groups of
    its own besides: the pipe group its loss is broadcast over, the model-parallel group of a replica's stages its
    gradient norm sums over, and with tp its own slice group, which gathers the partitioned activations and
    gradients it passes between stages (deepspeed/runtime/pipe/engine.py and topology.py; recorded on gloo ranks:
    tests/estimate/test_device.py). Each is a communicator of its own beside Megatron's tensor-parallel group."""
    par = job.parallel
    dp = np.asarray(1 if par.dp is None else par.dp)
    tp, pp, cp, vpp = (np.asarray(v) for v in (par.tp, par.pp, par.cp, par.vpp))
    # (HSDP: two; expert parallelism: its all-to-all group and the experts' data-parallel group beside dp's)
    ep = np.asarray(par.ep)
    edp = (ep > 1) & (dp // np.maximum(ep, 1) > 1)
    dims = (dp * cp > 1).astype(int) + (tp > 1) + (cp > 1) + (np.asarray(par.dp_replicate) > 1) + (ep > 1) + edp
    one_dim = (dims <= 1) & (pp == 1)
    world = (dp * tp * pp * cp > 1).astype(int)
    tied = (pp > 1) & bool(job.model.tie_embeddings) if job.model.has_shape else np.zeros_like(pp, dtype=bool)
    deepspeed_pipe = (pp > 1) & (par.backend == "deepspeed")  # (only where named: inferred, pp is Megatron's)
    engine = np.where(deepspeed_pipe, 2 + (tp > 1), 0)
    groups = np.where(one_dim, world, world + dims + tied + engine)
    peers = np.where(pp == 1, 0, np.where((pp > 2) | (vpp > 1), 2, 1))
    return groups, peers


@dataclass(frozen=True)
class DeviceMemory:
    allocated_bytes: float | np.ndarray
    workspace_bytes: float | np.ndarray
    fragmentation_bytes: float | np.ndarray
    context_bytes: float | np.ndarray
    comm_bytes: float | np.ndarray
    comm_groups: int | np.ndarray
    p2p_peers: int | np.ndarray
    comm_channels: int = 0
    """NCCL channels each collective communicator connects (0 where the library is not NCCL's design)."""

    @property
    def reserved_bytes(self):
        """torch.cuda.max_memory_reserved: the caching allocator's pool at the peak."""
        return self.allocated_bytes + self.workspace_bytes + self.fragmentation_bytes

    @property
    def device_bytes(self):
        """What nvidia-smi shows for the process at the peak."""
        return self.reserved_bytes + self.context_bytes + self.comm_bytes

    def terms(self) -> dict:
        """The parts above the tensors, for the estimate's JSON and its memory chart."""
        return {
            "workspace_bytes": self.workspace_bytes,
            "fragmentation_bytes": self.fragmentation_bytes,
            "context_bytes": self.context_bytes,
            "comm_bytes": self.comm_bytes,
            "comm_groups": self.comm_groups,
            "p2p_peers": self.p2p_peers,
            "comm_channels": self.comm_channels,
        }


def device_memory(job: Job, allocated_bytes, accelerator: Accelerator) -> DeviceMemory:
    """The reserved and device-visible peaks of a resolved job whose tensors peak at `allocated_bytes`."""
    a = assumptions_for(accelerator)
    share = a.fragmentation_expandable if job.memory.expandable_segments else a.fragmentation
    held = np.asarray(allocated_bytes, dtype=float) + a.workspace_bytes
    fragmentation = held * share / (1 - share)
    groups, peers = comm_groups(job)
    comm = groups * a.comm_group_bytes + peers * a.p2p_peer_bytes
    return DeviceMemory(
        allocated_bytes=allocated_bytes,
        workspace_bytes=a.workspace_bytes,
        fragmentation_bytes=fragmentation,
        context_bytes=a.context_bytes,
        comm_bytes=comm,
        comm_groups=groups,
        p2p_peers=peers,
        comm_channels=0 if a.communicator_bytes is not None else a.comm_channels,
    )
