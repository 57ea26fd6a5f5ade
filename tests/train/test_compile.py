"""`training.compile` (`--compile`): torchtitan's per-block compile, refused where the runner has not trained it, and
priced fused by the estimate (tests/estimate/test_compile_bytes.py). The loss equality of a compiled run with an eager one is a benchmark
(benchmarks/compile_check.py: inductor's first compile takes tens of seconds on this CPU)."""

from __future__ import annotations

import torch

from toolkit.estimate import estimate
from toolkit.program.build import build_model
from toolkit.specs import Job


def _job(**training) -> Job:
    return Job.from_dict(
        {"model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}, "training": training}
    )


def test_compile_compiles_each_block_in_place():
    from toolkit.program.build import compile_blocks

    model = build_model(_job().resolve()[0], torch.float32)
    keys = model.state_dict().keys()
    compile_blocks(model)
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert model._compiled_call_impl is None  # the model around them stays eager
    assert model.state_dict().keys() == keys  # checkpoints keep their keys


def test_the_estimate_says_what_compile_changes():
    notes = estimate(_job(compile=True))["notes"]
    assert any("training.compile" in n and "memory is the eager program's" in n for n in notes)


def test_compile_is_refused_where_it_is_not_trained(cli, tmp_path):
    code, _out, err = cli(
        "train",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--vocab",
        "256",
        "--seq",
        "32",
        "--compile",
        "--tp",
        "2",
        "--nproc",
        "2",
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 2 and err.count("\n") == 1 and "--compile" in err
