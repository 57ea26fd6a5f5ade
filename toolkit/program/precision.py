"""The six precision modes as the runner executes them.

    fp32        fp32 weights, fp32 math
    amp-bf16    fp32 weights; torch.autocast runs matmuls in bf16
    amp-fp16    the same in fp16, with dynamic loss scaling (torch.amp.GradScaler)
    mixed-bf16  bf16 weights and gradients; the optimizer updates fp32 master copies (DeepSpeed, Megatron)
    mixed-fp16  the same in fp16, with dynamic loss scaling on the master gradients
    pure-bf16   bf16 weights, gradients and optimizer states; no master copy

We call torch.autocast and GradScaler ourselves instead of accelerate's `mixed_precision`: on CPU
accelerate silently drops fp16 autocast and the scaler, and it has no master-weight mode.

`FP32Norm` is the article's trick: LayerNorm/RMSNorm with fp32 weights run on an fp32 copy of a
16-bit input. torch's kernels already accumulate a 16-bit norm's statistics in fp32, so at equal
weights the output is the same; what changes is that the norm's gains and biases are used (and,
in pure-bf16, updated) at full precision instead of rounded to 8 mantissa bits. Under autocast it
changes nothing: norms already run in fp32 on the fp32 residual stream (tests/train/test_precision.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from ..specs.precision import precision_plan

__all__ = ["TORCH_DTYPES", "TorchPrecision", "torch_precision", "FP32Norm", "use_fp32_norms", "MasterWeights"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The precision plan's dtype names (toolkit.specs.precision) as torch's dtypes."""


@dataclass(frozen=True)
class TorchPrecision:
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    loss_scaling: bool
    master_weights: bool

    def autocast(self, device_type: str):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.autocast_dtype)


def torch_precision(mode: str) -> TorchPrecision:
    """The mode's precision plan in torch's terms: the dtype the model is built in, autocast's, and the machinery."""
    plan = precision_plan(mode)
    return TorchPrecision(
        TORCH_DTYPES[plan.weights],
        plan.autocast and TORCH_DTYPES[plan.autocast],
        plan.loss_scaling,
        plan.master_weights,
    )


class FP32Norm(nn.Module):
    """Wraps a norm: its weights stay fp32 and it runs on x.float(); the output returns in x's dtype."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.norm(x.float()).to(x.dtype)


def use_fp32_norms(model: nn.Module) -> int:
    """Swap every LayerNorm/RMSNorm in `model` for an FP32Norm; returns how many were swapped."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.LayerNorm, nn.RMSNorm)):
                setattr(module, name, FP32Norm(child))
                swapped += 1
    return swapped


class MasterWeights:
    """fp32 master copies of a model's 16-bit trainable parameters, for the mixed-* modes.

    The optimizer sees `self.params`: the fp32 copy for a 16-bit parameter, the parameter itself for
    one already in fp32 (an FP32Norm). After backward, `grads_to_master` moves the 16-bit gradients
    into fp32; after the step, `master_to_model` writes the update back in 16 bits.

    With `main_grads` (precision.grad_dtype = fp32) the gradients are Megatron's fp32 main gradients
    instead: one flat fp32 buffer, allocated here and kept for the whole run (zeroed, never freed),
    whose views are the masters' `.grad`. Each 16-bit gradient is added into it the moment autograd
    makes it and then dropped, so accumulation over micro-batches happens in fp32 and at most one
    16-bit gradient exists at a time."""

    def __init__(self, model: nn.Module, main_grads: bool = False):
        self.pairs = []
        for p in model.parameters():
            if p.requires_grad:
                master = p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True)
                self.pairs.append((p, master))
        self.params = [m for _, m in self.pairs]
        self.main_grads: torch.Tensor | None = None
        self._views: list[tuple[torch.Tensor, torch.Tensor]] = []
        if main_grads:
            halves = [(p, m) for p, m in self.pairs if m is not p]
            self.main_grads = torch.zeros(
                sum(m.numel() for _, m in halves), dtype=torch.float32, device=halves[0][1].device if halves else "cpu"
            )
            offset = 0
            for p, m in halves:
                view = self.main_grads[offset : offset + m.numel()].view_as(m)
                offset += m.numel()
                self._views.append((m, view))
                p.register_post_accumulate_grad_hook(_add_into(view))
            self.zero_grad()

    def grads_to_master(self) -> None:
        if self.main_grads is not None:  # already there, in fp32
            return
        for p, m in self.pairs:
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None

    def grad_buffers(self) -> list[torch.Tensor]:
        """With main gradients, the tensors that hold every master gradient (data parallelism all-reduces these):
        the buffer, and the own gradients of parameters already in fp32 (FP32Norm's)."""
        own = [p.grad for p, m in self.pairs if m is p and p.grad is not None]
        return ([self.main_grads] if self.main_grads is not None else []) + own

    def zero_grad(self) -> None:
        """After the optimizer's own zero_grad: the main gradients zeroed in place and handed back to the masters
        (the buffer persists across steps, as Megatron's does); nothing to do without main gradients."""
        if self.main_grads is not None:
            self.main_grads.zero_()
            for m, view in self._views:
                m.grad = view

    @torch.no_grad()
    def master_to_model(self) -> None:
        for p, m in self.pairs:
            if m is not p:
                p.copy_(m)

    def state_dict(self) -> list[torch.Tensor]:
        return [m.detach() for _, m in self.pairs]

    @torch.no_grad()
    def load_state_dict(self, tensors: list[torch.Tensor]) -> None:
        for (_, m), t in zip(self.pairs, tensors, strict=True):
            m.copy_(t)


def _add_into(main_grad: torch.Tensor):
    """A post-accumulate-grad hook: the parameter's new 16-bit gradient added into its fp32 main gradient, then
    dropped (the next micro-batch's gradient starts from nothing, so no 16-bit sum builds up)."""

    def hook(param: torch.Tensor) -> None:
        main_grad.add_(param.grad)
        param.grad = None

    return hook
