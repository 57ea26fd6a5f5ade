"""Which device a rank computes on: the one place that asks torch whether a GPU is here (torchtitan's
device_type), so train, generate, calibrate and the command line agree.

    device_type()            # "cuda" where a GPU is visible, else "cpu"
    rank_device(local_rank)  # torch.device("cuda", local_rank % GPUs) or torch.device("cpu")
"""

from __future__ import annotations

import torch

__all__ = ["device_type", "rank_device", "has_gpu"]


def has_gpu() -> bool:
    return torch.cuda.is_available()


def device_type() -> str:
    return "cuda" if has_gpu() else "cpu"


def rank_device(local_rank: int = 0) -> torch.device:
    """The device of a rank: its GPU on this host (ranks beyond the GPUs share them round the table), or the CPU."""
    if not has_gpu():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
