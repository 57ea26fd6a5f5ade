"""The memory model over arrays of layouts gives, entry by entry, what it gives for each layout's own Job."""

import numpy as np
import pytest

from toolkit.estimate.grid import layout_grid
from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job, SpecError


def base_job(mode="amp-bf16", grads="param", finetune=None):
    return Job.from_dict(
        {
            "model": {"preset": "llama2-7b"},
            "precision": {"mode": mode, "grad_dtype": grads},
            "batch": {"micro_batch": 1, "global_batch": 512},
            "finetune": finetune or {},
            "cluster": {"accelerator": "H100-SXM", "count": 64},
        }
    ).resolve()[0]


LORA = {"method": "lora", "rank": 16, "targets": ["q", "v"]}


@pytest.mark.parametrize(
    "mode, grads, finetune",
    [
        ("amp-bf16", "param", None),
        ("mixed-bf16", "param", None),
        ("mixed-bf16", "fp32", None),
        ("amp-bf16", "param", LORA),
        ("pure-bf16", "param", {**LORA, "method": "qlora"}),  # (the planner's LoRA crash)
    ],
    ids=["amp", "mixed", "mixed-main-grads", "lora", "qlora"],
)
def test_grid_equals_one_job_at_a_time(mode, grads, finetune):
    job = base_job(mode, grads, finetune)
    grid = layout_grid(
        job,
        tp=[1, 2, 4, 8],
        pp=[1, 2, 4],
        zero=[0, 1, 2, 3],
        micro_batch=[1, 2, 4],
        recompute=["none", "selective", "full"],
        sp=[False, True],
        offload=["none", "optimizer", "params"],
    )
    mem = memory_estimate(grid.job)
    checked = 0
    for i in range(0, len(grid), 1 if finetune else 7):  # (adapters: replicas only, so every row)
        layout = grid.layout(i)
        data = {
            **job.to_dict(),
            "parallel": {
                **job.to_dict()["parallel"],
                **{k: layout[k] for k in ("tp", "pp", "vpp", "sp", "zero", "offload", "dp")},
            },
            "batch": {"micro_batch": layout["micro_batch"], "global_batch": 512},
            "memory": {**job.to_dict()["memory"], "recompute": layout["recompute"]},
        }
        try:
            single, _ = Job.from_dict(data).resolve()
        except SpecError:
            assert not grid.valid[i], layout  # the grid's rules refuse what resolve() refuses
            continue
        assert grid.valid[i], layout
        one = memory_estimate(single)
        assert mem.peak_bytes[i] == pytest.approx(float(one.peak_bytes), rel=1e-12), layout
        assert mem.activations_bytes[i] == pytest.approx(float(one.activations_bytes), rel=1e-12)
        assert mem.host_bytes[i] == pytest.approx(float(one.host_bytes), rel=1e-12)
        assert mem.peak_phase[i] == one.peak_phase
        checked += 1
    assert checked > (10 if finetune else 30)


def test_grid_refuses_what_resolve_refuses_for_interleaved_batches():
    """An odd number of micro-batches per step: interleaved layouts whose rounds do not divide it are invalid in both
    (the planner once ranked such a layout first and crashed in the schedule simulator)."""
    job = Job.from_dict(
        {
            "model": {"preset": "gpt3-2.7b"},
            "batch": {"micro_batch": 1, "global_batch": 62},
            "parallel": {"pp": 2},
            "cluster": {"accelerator": "H100-SXM", "count": 4},
        }
    ).resolve()[0]
    grid = layout_grid(job, tp=[1, 2], pp=[1, 2, 4], vpp=[1, 2, 4], micro_batch=[1, 2])
    refused = 0
    for i in range(len(grid)):
        layout = grid.layout(i)
        data = {
            **job.to_dict(),
            "parallel": {**job.to_dict()["parallel"], **{k: layout[k] for k in ("tp", "pp", "vpp", "dp")}},
            "batch": {"micro_batch": layout["micro_batch"], "global_batch": 62},
        }
        try:
            Job.from_dict(data).resolve()
        except SpecError:
            assert not grid.valid[i], layout
            refused += 1
            continue
        assert grid.valid[i], layout
    assert refused >= 4


def test_grid_speed_is_planner_class():
    """Not a timing assertion: just that a 10^4-layout grid is one vectorised call, not a Python loop."""
    grid = layout_grid(
        base_job(),
        tp=[1, 2, 4, 8],
        pp=[1, 2, 4, 8],
        zero=[0, 1, 2, 3],
        micro_batch=[1, 2, 4, 8, 16],
        recompute=["none", "selective", "full"],
        sp=[False, True],
        vpp=[1, 2],
        offload=["none", "params"],
    )
    mem = memory_estimate(grid.job)
    assert mem.peak_bytes.shape == (len(grid),) and len(grid) == 7680
    assert np.isfinite(mem.peak_bytes[grid.valid]).all()


@pytest.mark.parametrize(
    "mode, finetune, backend",
    [("amp-bf16", None, None), ("mixed-bf16", None, None), ("amp-bf16", LORA, None), ("mixed-bf16", None, "deepspeed")],
    ids=["torch", "deepspeed", "lora", "named-backend"],
)
def test_grid_and_resolve_agree_on_every_layout_rule(mode, finetune, backend):
    """Every layout of a grid that breaks each rule in turn (heads, devices, sequence, stages, vpp, rounds, sp,
    batch, offload, adapters, a named backend that another layout's program is not): valid in the grid exactly when
    Job.resolve accepts it."""
    model = {
        "layers": 5,  # (on pp 4 × vpp 2 even Megatron's accounting leaves a chunk without a layer)
        "hidden": 96,
        "heads": 6,
        "kv_heads": 2,
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position": "rope",
        "vocab": 128,
        "seq_len": 24,
    }
    base = {
        "model": model,
        "precision": {"mode": mode},
        "batch": {"micro_batch": 1, "global_batch": 36},
        "parallel": {"backend": backend, "zero": 1 if backend else 0},
        "finetune": finetune or {},
        "cluster": {"accelerator": "H100-SXM", "count": 12, "gpus_per_node": 12},
    }
    job = Job.from_dict(base).resolve()[0]
    grid = layout_grid(
        job,
        tp=[1, 2, 3, 4],
        pp=[1, 2, 4],
        vpp=[1, 2],
        cp=[1, 2, 5],
        sp=[False, True],
        zero=[0, 1, 3],
        offload=["none", "optimizer", "params"],
        micro_batch=[1, 2],
    )
    refused_by = set()
    for i in range(len(grid)):
        layout = grid.layout(i)
        data = {
            **base,
            "parallel": {
                **{k: layout[k] for k in ("tp", "pp", "vpp", "cp", "sp", "zero", "offload")},
                "backend": backend,
            },
            "batch": {"micro_batch": layout["micro_batch"], "global_batch": 36},
        }
        try:
            Job.from_dict(data).resolve()
        except SpecError as refused:
            assert not grid.valid[i], (layout, str(refused))
            refused_by.add(refused.field)
            continue
        assert grid.valid[i], layout
    assert grid.valid.any()
    assert {
        "parallel.tp",
        "parallel.cp",
        "parallel.pp",
        "parallel.vpp",
        "parallel.sp",
        "batch.global_batch",
        "parallel.offload",
    } <= refused_by
    if finetune:
        assert "finetune.method" in refused_by
    if backend:
        assert "parallel.backend" in refused_by
