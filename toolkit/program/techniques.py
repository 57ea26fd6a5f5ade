"""Memory and model-size techniques the article names: magnitude pruning and int8 activations.

Pruning acts on the matrices of the transformer blocks (not embeddings, head, norms or biases).
`magnitude` ranks all those weights together and zeroes the smallest `sparsity` share (global,
unstructured); `2:4` keeps the two largest of every four consecutive weights along the input
dimension, the pattern sparse tensor cores run at twice the speed. Masks are applied again after
every optimizer step, so pruned weights stay zero while the rest train.

`Int8Activations` stores the floating-point tensors autograd saves inside the blocks as int8 with
one fp32 scale per 128 values and restores them in backward: about half the bytes of bf16, a
quarter of fp32. Tensors that share storage with a parameter are left alone (they are weights,
kept anyway), and one tensor saved by several operations is packed once.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

__all__ = ["Pruner", "block_matrices", "Int8Activations"]


def block_matrices(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Trainable 2-D weights inside `model.blocks` (LoRA adapters excluded: they are the update)."""
    return [
        (f"blocks.{name}", p)
        for name, p in model.blocks.named_parameters()
        if p.dim() == 2 and p.requires_grad and not name.endswith((".a", ".b"))
    ]


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
        for name, tensor in tensors.items():
            tensor.mul_(self.masks[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.masks)

    def load_state_dict(self, masks: dict[str, torch.Tensor]) -> None:
        self.masks = dict(masks)


def _storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage, shared by its views; works for fake tensors too (the tracer's)."""
    return t.untyped_storage()._cdata


INT8_BYTES_PER_VALUE = 1 + 4 / 128
"""One int8 byte plus a share of the fp32 scale of its block of 128 (toolkit.estimate models the same)."""


class Int8Activations:
    """Compress what the transformer blocks save for backward:

        int8 = Int8Activations(model)       # hooks every block of model.blocks
        with int8:                          # compress during this forward
            loss = model(x, y)
        loss.backward()

    Tensors are quantised in blocks of 128 consecutive values, each with an fp32 scale (absmax / 127):
    1.03 bytes per value instead of 2 (bf16) or 4 (fp32). Only the blocks' tensors are compressed:
    the loss keeps its log-probabilities exact (int8 log-probs would bend every gradient by a few %)."""

    BLOCK = 128
    CHUNK = 4096
    """Blocks quantised at once: bounds the fp32 temporaries of packing and unpacking to 2 MiB."""

    def __init__(self, model: nn.Module, min_numel: int = 4096):
        self.param_storages = {_storage_key(p) for p in model.parameters()}
        self.param_storages |= {_storage_key(b) for b in model.buffers()}
        self.min_numel = min_numel
        self.packed_bytes = 0
        """Bytes of int8 payload and scales packed during the last forward."""
        self.original_bytes = 0
        """Bytes the same tensors would have taken unpacked."""
        self.active = False
        self._seen: dict = {}
        self._stack: list = []
        for block in model.blocks:
            block.register_forward_pre_hook(self._enter_block)
            block.register_forward_hook(self._leave_block)

    def __enter__(self):
        self.packed_bytes = self.original_bytes = 0
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        self._seen = {}  # the graph keeps what it needs; drop our references

    def _enter_block(self, _module, _args):
        if self.active and torch.is_grad_enabled():
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            hooks.__enter__()
            self._stack.append(hooks)

    def _leave_block(self, _module, _args, _output):
        if self._stack and self.active and torch.is_grad_enabled():
            self._stack.pop().__exit__(None, None, None)

    def _pack(self, t: torch.Tensor):
        if not t.is_floating_point() or t.numel() < self.min_numel or _storage_key(t) in self.param_storages:
            return t
        key = (_storage_key(t), t.storage_offset(), tuple(t.shape), t.stride(), t._version)
        owner = t._base if t._base is not None else t  # views of one tensor share their base object
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is owner:  # the same live tensor saved again (a freed address can be reused)
            return hit[1]
        flat = t.detach().reshape(-1)
        pad = -flat.numel() % self.BLOCK
        blocks = (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).view(-1, self.BLOCK)
        q = torch.empty(blocks.shape, dtype=torch.int8, device=t.device)
        scale = torch.empty(blocks.shape[0], 1, dtype=torch.float32, device=t.device)
        for lo in range(0, blocks.shape[0], self.CHUNK):  # fp32 temporaries of one chunk at a time
            part = blocks[lo : lo + self.CHUNK].to(torch.float32, copy=True)
            s = part.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127.0)
            q[lo : lo + self.CHUNK] = part.div_(s).round_().clamp_(-127, 127)
            scale[lo : lo + self.CHUNK] = s
        packed = (q, scale, t.dtype, t.shape, flat.numel())
        self.packed_bytes += q.numel() + 4 * scale.numel()
        self.original_bytes += t.numel() * t.element_size()
        self._seen[key] = (weakref.ref(owner), packed)
        return packed

    @classmethod
    def _unpack(cls, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        q, scale, dtype, shape, numel = packed
        out = torch.empty(q.shape, dtype=dtype, device=q.device)
        for lo in range(0, q.shape[0], cls.CHUNK):
            out[lo : lo + cls.CHUNK] = q[lo : lo + cls.CHUNK].float().mul_(scale[lo : lo + cls.CHUNK])
        return out.view(-1)[:numel].view(shape)
