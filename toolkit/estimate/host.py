"""Host memory: for offload, what a node's offloaded states take against the RAM it has; for runs on this machine,
what it has available. DeepSpeed's own estimators
report host memory beside the device's; a plan that offloads 6 TB into one 8-GPU box is not a fit.

    need, have, source = host_memory(job, catalog, host_bytes_per_device)   # bytes a node, bytes usable, why
"""

from __future__ import annotations

import numpy as np

from ..specs.catalog import Catalog
from ..specs.job import Job

__all__ = [
    "host_memory",
    "host_available_bytes",
    "ASSUMED_HOST_GIB_PER_GPU",
    "HOST_USABLE_FRACTION",
    "RANK_BASELINE_BYTES",
]

GIB = 2**30
ASSUMED_HOST_GIB_PER_GPU = 128
"""Host RAM a GPU gets where neither the job, its offer nor the accelerator's reference system says: a DGX A100
(320 GB) has 1 TB for 8 GPUs (NVIDIA's datasheet). An assumption, said in the notes."""
HOST_USABLE_FRACTION = 0.8
"""Share of a node's RAM offloaded states may take: the OS, the data loaders, pinned staging buffers and the
checkpoint writer take the rest. Assumed."""


def host_memory(job: Job, catalog: Catalog, host_bytes_per_device):
    """(bytes a node's offloaded states take, bytes of its RAM they may use, where the RAM figure comes from).
    `host_bytes_per_device` may be an array (a planner's grid)."""
    per_node = min(job.cluster.count or 1, job.cluster.gpus_per_node)
    need = np.asarray(host_bytes_per_device, dtype=float) * per_node
    gib, source = _node_ram_gib(job, catalog)
    return need, gib * GIB * HOST_USABLE_FRACTION, source


def _node_ram_gib(job: Job, catalog: Catalog) -> tuple[float, str]:
    if job.cluster.host_memory_gib is not None:
        return job.cluster.host_memory_gib, "given"
    if job.cost.offer:
        offer = catalog.offer(job.cost.offer)
        if offer.host_memory_gib is not None:
            return offer.host_memory_gib * job.cluster.gpus_per_node / offer.count, "offer"
    acc = catalog.accelerator(job.cluster.accelerator) if job.cluster.accelerator else None
    if acc is not None and acc.host_memory_gib_per_node is not None:
        return acc.host_memory_gib_per_node * job.cluster.gpus_per_node / 8, "accelerator"
    return ASSUMED_HOST_GIB_PER_GPU * job.cluster.gpus_per_node, "assumed"


RANK_BASELINE_BYTES = 0.4 * 2**30
"""What a rank holds besides its tensors on a CPU: the interpreter, torch, the runner and gloo's buffers (the
README's small runs measure 0.33-0.5 GiB of peak RSS a rank)."""


def host_available_bytes() -> float | None:
    """MemAvailable of /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
