"""Bytes an eager attention core's element-wise kernels move, as the step-time model counts them
(toolkit.estimate.steptime), against what the runner's own core (toolkit.program.model.Attention.core) reads and
writes, counted op by op at torch's dispatcher: every score-sized tensor an op reads or writes, views aside."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from toolkit.estimate.elementwise import memory_bound_bytes_per_token
from toolkit.program.model import Attention
from toolkit.specs import Job

PRODUCTS = {torch.ops.aten.bmm.default, torch.ops.aten.mm.default, torch.ops.aten.matmul.default}
NO_TRAFFIC = {torch.ops.aten.empty_like.default, torch.ops.aten._unsafe_view.default}  # no bytes move
NO_READ = {torch.ops.aten.bernoulli_.float}  # it only writes its output


def score_bytes(fn, score_numel: int) -> int:
    """Bytes of score-sized tensors (numel ≥ score_numel) that fn's non-product, non-view ops read and write."""
    moved = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in PRODUCTS or func.is_view or func in NO_TRAFFIC:
                return out
            big = lambda t: isinstance(t, torch.Tensor) and t.numel() >= score_numel  # noqa: E731
            reads = [] if func in NO_READ else [a for a in list(args) + list((kwargs or {}).values()) if big(a)]
            writes = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if big(o)]
            moved[0] += sum(t.numel() * t.element_size() for t in reads + writes)
            return out

    with Count():
        fn()
    return moved[0]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_an_eager_cores_element_wise_bytes_are_what_its_ops_read_and_write(dropout):
    job = Job.from_dict(
        {
            "model": {"layers": 1, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 64, "dropout": dropout},
            "batch": {"micro_batch": 2, "global_batch": 2},
            "precision": {"mode": "fp32"},
            "memory": {"attention": "eager", "program": "cpu"},
        }
    )
    m, b = job.model, job.batch.micro_batch
    core = Attention(m, "eager", False).train()
    q, k, v = (torch.randn(b, m.heads, m.seq_len, m.head_dim_, requires_grad=True) for _ in range(3))
    torch.manual_seed(0)
    measured = score_bytes(lambda: core.core(q, k, v).sum().backward(), b * m.heads * m.seq_len * m.seq_len)
    flash = job.replace(memory=dataclasses.replace(job.memory, attention="flash"))
    modelled = (
        (float(memory_bound_bytes_per_token(job, False)) - float(memory_bound_bytes_per_token(flash, False)))
        * b
        * m.seq_len
    )
    assert modelled == pytest.approx(measured, rel=0.05), (modelled, measured)
