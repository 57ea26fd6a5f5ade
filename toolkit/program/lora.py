"""LoRA adapters (Hu et al. 2021) on the runner's GPT: frozen base weights, trainable low-rank updates.

    apply_lora(model, rank=8, alpha=16, targets=("q", "v"))

y = base(x) + B(A(x)) · alpha / rank, with A (rank × in) initialised like nn.Linear and B
(out × rank) zero, so training starts from the base model. Every other parameter is frozen.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LoRALinear", "apply_lora"]


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, rank: int, alpha: float):
        super().__init__()
        self.base = base
        # the base's dtype and device (an NF4Linear keeps codes, not a weight: the dtype it was made from)
        like = base.weight if isinstance(base, nn.Linear) else base.absmax_scale
        dtype = like.dtype if isinstance(base, nn.Linear) else base.weight_dtype
        self.a = nn.Parameter(torch.empty(rank, base.in_features, dtype=dtype, device=like.device))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=dtype, device=like.device))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + nn.functional.linear(nn.functional.linear(x, self.a), self.b) * self.scaling


def apply_lora(model: nn.Module, rank: int, alpha: float, targets, base_types=(nn.Linear,)) -> nn.Module:
    """Freeze every parameter of `model`, then wrap each Linear named in `targets` with an adapter."""
    for p in model.parameters():
        p.requires_grad_(False)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, base_types):
                setattr(module, name, LoRALinear(child, rank, alpha))
    return model
