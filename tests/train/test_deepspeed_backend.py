"""The DeepSpeed backend trained for real: mixed-bf16 (and fp32) ZeRO-2 on 2 gloo ranks against one torch process, its
per-rank memory against the estimate, and a refusal to resume on another world size (its SIGKILL-and-resume, bit
for bit, is in benchmarks/soak.py).
(Its own file so that pytest-xdist runs it beside the other layout tests.)"""

import pytest

from toolkit.runs.folder import read_rank_memory
from toolkit.specs import Job

from .test_layouts import STEPS, _assert_close, _compare, _records
from .test_runner import toolkit_train, train_here


def test_deepspeed_zero2_trains_as_one_mixed_process_and_refuses_other_rank_counts(tmp_path, corpus, capsys):
    """mixed-bf16 with ZeRO runs DeepSpeed's engine (configured as the estimate models it), against the torch
    backend's one process with fp32 master weights: bf16 weights and gradients reduced over other ranks round
    differently (tolerance 1e-3). Its checkpoints are DeepSpeed's partitions, for as many ranks as wrote them."""
    one, ref = tmp_path / "one", tmp_path / "ref"
    args = (*STEPS, "--precision", "mixed-bf16", "--data", str(corpus))
    assert train_here(one, *args).returncode == 0
    result = toolkit_train(ref, *args, "--zero", "2", "--nproc", "2")
    assert result.returncode == 0, result.stderr
    assert Job.from_yaml(ref / "job.yaml").resolve()[0].backend == "deepspeed"
    _assert_close(_records(ref), _records(one), rel=1e-3)
    assert (ref / "checkpoints" / "step_00000006.ds").is_dir()
    assert [r["rank"] for r in read_rank_memory(ref)] == [0, 1]  # flat buffers and partitions, measured by the run
    for rank in _compare(ref, capsys)["ranks"]:
        assert abs(rank["peak_bytes"]["error"]) < 0.01
    # (its SIGKILL-and-resume, bit for bit: benchmarks/soak.py --extra "--zero 2 --precision mixed-bf16")
    moved = train_here(
        ref, *STEPS[2:], "--steps", "8", "--precision", "mixed-bf16", "--zero", "2", "--data", str(corpus)
    )
    assert moved.returncode != 0 and "written by 2 ranks" in moved.stderr and "--nproc 2" in moved.stderr


@pytest.mark.slow  # a further point beside the ZeRO-2 mixed run above: make test-slow (make test keeps its 12 minutes)
def test_deepspeed_in_fp32_trains_as_one_fp32_process(tmp_path, corpus, capsys):
    """`--backend deepspeed --zero 2` on the README's small GPT in fp32: DeepSpeed's engine without a 16-bit section
    sums the same fp32 numbers as one torch process in another order (the fp32 tolerance, 1e-5), and each rank's
    measured tensors are its estimate (DeepSpeed's fp32 buckets and partition copy included)."""
    one, ref = tmp_path / "one", tmp_path / "ref"
    args = (*STEPS, "--data", str(corpus))
    assert train_here(one, *args).returncode == 0
    result = toolkit_train(ref, *args, "--backend", "deepspeed", "--zero", "2", "--nproc", "2")
    assert result.returncode == 0, result.stderr
    assert Job.from_yaml(ref / "job.yaml").resolve()[0].backend == "deepspeed"
    _assert_close(_records(ref), _records(one), rel=1e-5)
    assert (ref / "checkpoints" / "step_00000006.ds").is_dir()
    for rank in _compare(ref, capsys)["ranks"]:
        assert abs(rank["peak_bytes"]["error"]) < 0.01
