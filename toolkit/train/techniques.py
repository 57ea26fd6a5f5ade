"""Memory and model-size techniques the article names: magnitude pruning and int8 activations.

Pruning acts on the matrices of the transformer blocks (not embeddings, head, norms or biases).
`magnitude` ranks all those weights together and zeroes the smallest `sparsity` share (global,
unstructured); `2:4` keeps the two largest of every four consecutive weights along the input
dimension, the pattern sparse tensor cores run at twice the speed. Masks are applied again after
every optimizer step, so pruned weights stay zero while the rest train.

`Int8Activations` stores every floating-point tensor autograd saves for backward as int8 with one
fp32 scale per row (absmax / 127) and restores it in backward: about half the bytes of bf16,
a quarter of fp32. Tensors that share storage with a parameter are left alone (they are weights,
kept anyway), and one tensor saved by several operations is packed once.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["Pruner", "block_matrices", "Int8Activations"]


def block_matrices(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Trainable 2-D weights inside `model.blocks` (LoRA adapters excluded: they are the update)."""
    return [(f"blocks.{name}", p) for name, p in model.blocks.named_parameters()
            if p.dim() == 2 and p.requires_grad and not name.endswith((".a", ".b"))]


class Pruner:
    def __init__(self, method: str, sparsity: float):
        self.method, self.sparsity = method, sparsity
        self.masks: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def compute(self, matrices: list[tuple[str, torch.Tensor]]) -> None:
        if self.method == "magnitude":
            flat = torch.cat([p.detach().abs().float().flatten() for _, p in matrices])
            keep = torch.ones_like(flat, dtype=torch.bool)
            keep[flat.argsort()[: int(self.sparsity * flat.numel())]] = False  # exact count, ties broken by order
            for (name, p), part in zip(matrices, keep.split([p.numel() for _, p in matrices])):
                self.masks[name] = part.view_as(p)
        elif self.method == "2:4":
            for name, p in matrices:
                if p.shape[1] % 4:
                    raise ValueError(f"2:4 pruning needs input sizes divisible by 4; {name} has {p.shape[1]}")
                groups = p.detach().abs().float().view(p.shape[0], -1, 4)
                top = groups.topk(2, dim=-1).indices
                self.masks[name] = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, top, True).view_as(p)

    @torch.no_grad()
    def apply(self, tensors: dict[str, torch.Tensor]) -> None:
        """Zero the pruned entries of each named tensor (model weights, and their fp32 masters)."""
        for name, mask in self.masks.items():
            tensors[name].mul_(mask)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.masks)

    def load_state_dict(self, masks: dict[str, torch.Tensor]) -> None:
        self.masks = dict(masks)


class Int8Activations:
    """`with Int8Activations(model): loss = model(x, y)` — then backward as usual."""

    def __init__(self, model: nn.Module, min_numel: int = 4096):
        self.param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.param_storages |= {b.untyped_storage().data_ptr() for b in model.buffers()}
        self.min_numel = min_numel
        self.packed_bytes = 0
        """Bytes of the int8 payload and scales packed during the last forward."""
        self.original_bytes = 0
        """Bytes the same tensors would have taken unpacked."""
        self._seen: dict = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self.packed_bytes = self.original_bytes = 0
        self._seen = {}
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._seen = {}              # the graph keeps what it needs; drop our references

    def _pack(self, t: torch.Tensor):
        if (not t.is_floating_point() or t.numel() < self.min_numel or t.dim() < 2
                or t.untyped_storage().data_ptr() in self.param_storages):
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t._version)
        if key in self._seen:
            return self._seen[key]
        rows = t.detach().float()
        scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
        packed = ((rows / scale).round_().clamp_(-127, 127).to(torch.int8), scale, t.dtype)
        self.packed_bytes += packed[0].numel() + 4 * scale.numel()
        self.original_bytes += t.numel() * t.element_size()
        self._seen[key] = packed
        return packed

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        q, scale, dtype = packed
        return (q.float() * scale).to(dtype)
