"""QLoRA (Dettmers et al. 2023): frozen 4-bit NormalFloat weights under LoRA adapters, in plain torch.

    apply_qlora(model, rank=8, alpha=16, targets=("q", "v"))

Every Linear of the transformer blocks is stored as NF4: blocks of 64 weights share one absmax,
each weight is the index (4 bits, two per byte) of the nearest of 16 levels placed at the
quantiles of a normal distribution. The absmax values are quantized again (double
quantization): 8 bits each, minus their mean, with one fp32 scale per 256 of them. That is
the layout bitsandbytes uses on GPUs, so the bytes here are the bytes there:
0.5 + 1/64 + 4/(64·256) bytes a weight. This implementation runs anywhere torch does (CPU
included, and under fake tensors, so the tracer can measure it); bitsandbytes' CUDA kernels
are faster. The matmul dequantizes the weight to the compute dtype for forward and again for
backward, keeping nothing but the 4-bit codes between them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..estimate.states import NF4_BLOCK, NF4_SCALE_BLOCK  # one definition of the layout; its bytes live there too
from .lora import apply_lora

__all__ = ["NF4Linear", "apply_qlora", "NF4_LEVELS"]

# The 16 NF4 levels: quantiles of N(0, 1) normalised to [-1, 1], with an exact zero
# (QLoRA paper, appendix E; the same table as bitsandbytes' NF4 data type).
NF4_LEVELS = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


class NF4Linear(nn.Module):
    """A frozen Linear whose weight is stored in NF4; forward computes in `compute_dtype`."""

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        weight = linear.weight.detach()
        if weight.numel() % (NF4_BLOCK * NF4_SCALE_BLOCK):
            raise ValueError(
                f"NF4 needs weights in multiples of {NF4_BLOCK * NF4_SCALE_BLOCK} values; "
                f"{tuple(weight.shape)} has {weight.numel()}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        self.weight_dtype = weight.dtype  # the model's dtype, which LoRA adapters on top take
        codes, absmax_q, scale, mean = _quantize(weight.float())
        self.register_buffer("codes", codes)  # uint8, two 4-bit indices each
        self.register_buffer("absmax_q", absmax_q)  # int8, one per 64 weights
        self.register_buffer("absmax_scale", scale)  # fp32, one per 256 absmax values
        self.register_buffer("absmax_mean", mean)  # fp32 scalar
        self.register_buffer(
            "levels", torch.tensor(NF4_LEVELS, dtype=compute_dtype, device=weight.device), persistent=False
        )
        self.bias = (
            None if linear.bias is None else nn.Parameter(linear.bias.detach().to(compute_dtype), requires_grad=False)
        )

    def dequantize(self) -> torch.Tensor:
        """The weight in the compute dtype. Transients, per weight: the 4-bit indices unpacked to one byte, then
        as int32 for the table lookup, and the looked-up levels (about 9 bytes with the result)."""
        absmax = self.absmax_q.float().view(-1, NF4_SCALE_BLOCK) * self.absmax_scale[:, None] + self.absmax_mean
        indices = torch.stack((self.codes >> 4, self.codes & 15), dim=-1).view(-1, NF4_BLOCK).int()
        blocks = self.levels[indices] * absmax.reshape(-1, 1).to(self.compute_dtype)
        return blocks.view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _NF4Matmul.apply(x.to(self.compute_dtype), self)
        return y if self.bias is None else y + self.bias


class _NF4Matmul(torch.autograd.Function):
    """x @ Wᵀ with W dequantized on the fly: nothing of size W or x is kept for backward (W is frozen)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, module: NF4Linear) -> torch.Tensor:
        ctx.module = module
        return x @ module.dequantize().t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad @ ctx.module.dequantize(), None


def _quantize(weight: torch.Tensor):
    blocks = weight.reshape(-1, NF4_BLOCK)
    absmax = blocks.abs().amax(dim=1).clamp_min(1e-12)
    levels = torch.tensor(NF4_LEVELS, device=weight.device)
    indices = ((blocks / absmax[:, None]).unsqueeze(-1) - levels).abs().argmin(dim=-1).to(torch.uint8)
    pairs = indices.view(-1, 2)
    codes = (pairs[:, 0] << 4) | pairs[:, 1]
    mean = absmax.mean()
    centred = (absmax - mean).view(-1, NF4_SCALE_BLOCK)
    scale = centred.abs().amax(dim=1).clamp_min(1e-12) / 127
    absmax_q = torch.round(centred / scale[:, None]).clamp(-127, 127).to(torch.int8).view(-1)
    return codes, absmax_q, scale, mean


def apply_qlora(model: nn.Module, rank: int, alpha: float, targets, compute_dtype=torch.bfloat16) -> nn.Module:
    """Quantize every Linear inside the transformer blocks to NF4, then add LoRA adapters on `targets`.

    Embeddings, norms and the output projection keep their dtype (as bitsandbytes' QLoRA recipe keeps
    the output head), and everything but the adapters is frozen."""
    for block in model.blocks:
        for module in list(block.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, NF4Linear(child, compute_dtype))
    return apply_lora(model, rank, alpha, targets, base_types=(nn.Linear, NF4Linear))
