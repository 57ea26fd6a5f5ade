"""The DeepSpeed backend: the job's model and optimizer handed to DeepSpeed's engine, configured by
`deepspeed_config(job)`, the configuration the estimate models and the tracer runs (toolkit.export.deepspeed).

    engine, optimizer = deepspeed_engine(job, model, optimizer)
    loss = engine(tokens, targets); engine.backward(loss); engine.step()    # every micro-batch

DeepSpeed owns what happens between the forward and the update: 16-bit weights with fp32 master partitions
(ZeRO-1), partitioned gradients (2), partitioned weights (3), the optimizer states on the host with
ZeRO-Offload, gradient accumulation (it divides each micro-batch's loss) and clipping. Its checkpoints are its
own (toolkit.checkpoint.deepspeed).
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

from ..export.deepspeed import deepspeed_config
from ..specs.errors import SpecError
from ..specs.job import Job

__all__ = ["import_deepspeed", "deepspeed_engine"]


def import_deepspeed():
    """DeepSpeed, set up for this machine: its CPU accelerator without a GPU, quiet logs, and none of its C++
    ops (the job's torch optimizer steps; probing a compiler for them takes seconds per rank)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        import deepspeed.ops
    except ImportError as missing:
        raise SpecError(
            "parallel.backend",
            "deepspeed",
            "needs the deepspeed package (pip install deepspeed); or train with the torch backend",
        ) from missing
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")  # DeepSpeed's old calls
    if not torch.cuda.is_available():
        deepspeed.ops.__compatible_ops__ = {}
    return deepspeed


def deepspeed_engine(job: Job, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """(engine, DeepSpeed's optimizer) for this rank; the process group is the one already running."""
    deepspeed = import_deepspeed()
    if not torch.distributed.is_initialized():  # one process: DeepSpeed still wants a process group
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
        os.environ.setdefault("LOCAL_RANK", "0")  # (DeepSpeed reads it; a launcher would have set it)
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(job), dist_init_required=False
    )
    return engine, ds_optimizer
