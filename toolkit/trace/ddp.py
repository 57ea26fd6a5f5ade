"""DDP's gradient buckets, reproduced on one traced process (DDP's C++ reducer reads values: no fake tensors)."""

from __future__ import annotations

import torch

from ..program.compat import MemTracker

__all__ = ["DDPBuckets"]


class DDPBuckets:
    """What DDP does to a replica's gradient memory, on one process (DDP's reducer is C++ that reads values, so it
    does not run on fake tensors): one bucket buffer per dtype, allocated at wrapping and kept for the run
    (counted as gradients); on the micro-batch that synchronises, each gradient, as autograd finishes it, is
    copied into its slice and replaced by a view of it (gradient_as_bucket_view), the original freed. Earlier
    micro-batches (no_sync) accumulate ordinary gradients beside the buckets. The runner's real DDP ranks
    measure the same (toolkit compare --run)."""

    def __init__(self, model: torch.nn.Module, tracker: MemTracker):
        params = [p for p in model.parameters() if p.requires_grad]
        self.views, self.buffers = {}, []
        for dtype in dict.fromkeys(p.dtype for p in params):
            group = [p for p in params if p.dtype == dtype]
            flat = torch.zeros(sum(p.numel() for p in group), dtype=dtype)
            tracker.track_gradients(flat)
            self.buffers.append(flat)
            offset = 0
            for p in group:
                self.views[p] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self.handles = []

    def syncing(self, on: bool) -> None:
        """Copy gradients into the buckets as they are made (the synchronising micro-batch), or stop."""
        for handle in self.handles:
            handle.remove()
        self.handles = [p.register_post_accumulate_grad_hook(self._into_bucket) for p in self.views] if on else []

    def _into_bucket(self, param: torch.Tensor) -> None:
        view = self.views[param]
        if param.grad is not view:
            view.copy_(param.grad)
            param.grad = view
