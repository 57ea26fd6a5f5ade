"""Bytes a compiled block's element-wise kernels move, as the step-time model counts them (the fused count that
`training.compile` and Megatron's fused kernels take), against what inductor's own scheduler says its generated
kernels read and write: torch's compiled program, forward and backward, with the matmuls and the attention kernel
(extern kernels) set aside. Inductor on a CPU fuses the element-wise ops as on a GPU; one compile takes about
half a minute here."""

import dataclasses

import pytest
import torch

from toolkit.estimate import estimate
from toolkit.estimate.elementwise import memory_bound_bytes_per_token
from toolkit.program.model import Block, rope_tables
from toolkit.specs import Job

LLAMA = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope"}
GPT = {"mlp": "gelu", "norm": "layernorm", "position": "learned"}


def _job(mode: str, shape: dict) -> Job:
    return Job.from_dict(
        {
            "model": {"layers": 1, "hidden": 256, "heads": 4, "vocab": 256, "seq_len": 128, "ffn": 512, **shape},
            "batch": {"micro_batch": 2, "global_batch": 2},
            "precision": {"mode": mode},
            "memory": {"attention": "flash", "program": "cpu"},
        }
    ).resolve()[0]


def inductor_elementwise_bytes(block: torch.nn.Module, x: torch.Tensor, cos, sin) -> int:
    """Bytes inductor's scheduled kernels of the compiled block's forward and backward read and write, less its
    extern kernels' (matmuls, attention)."""
    from torch._inductor import metrics
    from torch._inductor.scheduler import ExternKernelSchedulerNode

    torch._dynamo.reset()
    torch._logging.set_logs(inductor_metrics=True)  # inductor counts bytes only while this log is on
    try:
        metrics.reset()
        with (
            torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            torch.compile(block)(x, cos, sin).float().sum().backward()
        extern = sum(n for node, n in metrics.nodes_num_elem if isinstance(node, ExternKernelSchedulerNode))
        return metrics.num_bytes_accessed - 4 * extern  # nodes_num_elem holds bytes / 4
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()


@pytest.mark.parametrize("mode, shape", [("pure-bf16", LLAMA), ("fp32", GPT)], ids=["llama-bf16", "gpt-fp32"])
def test_a_compiled_blocks_element_wise_bytes_are_the_fused_count(mode, shape):
    job = _job(mode, shape)
    m, b = job.model, job.batch.micro_batch
    dtype = torch.bfloat16 if mode == "pure-bf16" else torch.float32
    torch.manual_seed(0)
    block = Block(m, "flash", False).to(dtype)
    cos, sin = rope_tables(m.seq_len, m.head_dim_)
    x = torch.randn(b, m.seq_len, m.hidden, dtype=dtype, requires_grad=True)
    measured = inductor_elementwise_bytes(block, x, cos, sin) / (b * m.seq_len)
    fused = float(memory_bound_bytes_per_token(job, False))
    eager = float(memory_bound_bytes_per_token(job, True))
    assert fused == pytest.approx(measured, rel=0.10), (fused, measured)
    if shape is LLAMA:  # Llama's composite RMSNorm and rotate_half, kernel by kernel: no stand-in
        assert eager > 2.5 * measured


def test_compile_shortens_a_gpu_step_by_its_element_wise_time_alone_and_says_so():
    eager = Job.from_dict(
        {
            "model": {"preset": "llama3-8b"},
            "cluster": {"accelerator": "H100-SXM", "count": 8},
            "parallel": {"zero": 3, "dp": 8},
            "precision": {"mode": "amp-bf16"},
        }
    )
    compiled = eager.replace(training=dataclasses.replace(eager.training, compile=True))
    e, c = (estimate(j)["time"] for j in (eager, compiled))
    saved_s = e["breakdown"]["memory_bound_s"] - c["breakdown"]["memory_bound_s"]
    assert saved_s > 0.3 * e["breakdown"]["memory_bound_s"]
    assert e["step_s"] - c["step_s"] == pytest.approx(saved_s, rel=1e-6)
    assert c["breakdown"]["compute_s"] == pytest.approx(e["breakdown"]["compute_s"])
    assert any("training.compile" in n and "fused" in n for n in estimate(compiled)["notes"])
