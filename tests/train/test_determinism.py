"""What pins a run's bits (toolkit/launch/determinism.py): the ranks' environment, the thread count a checkpoint
records, and a resume on another thread count said in one line. (20 repeated runs beside CPU hogs, bit for bit:
benchmarks/determinism.py; the bitwise-resume test runs beside a hog too.)"""

import torch

from toolkit.checkpoint import latest_checkpoint
from toolkit.launch.determinism import pin_environment


def test_every_rank_starts_with_mkl_and_openmp_pinned(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = pin_environment({"PATH": "/bin"}, ranks_on_machine=2)
    assert env["MKL_DYNAMIC"] == "FALSE" and env["OMP_DYNAMIC"] == "FALSE" and env["PATH"] == "/bin"
    assert int(env["OMP_NUM_THREADS"]) >= 1
    mine = pin_environment({"OMP_NUM_THREADS": "3", "MKL_DYNAMIC": "TRUE"}, ranks_on_machine=2)
    assert mine["OMP_NUM_THREADS"] == "3" and mine["MKL_DYNAMIC"] == "TRUE"  # a user's own settings win


def test_a_resume_on_another_thread_count_says_so_and_the_process_gets_its_threads_back(
    train, tmp_path, monkeypatch, capsys
):
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    train(training={"steps": 2, "checkpoint_every": 1})
    state, _, _ = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert state["threads"] == 2
    assert torch.get_num_threads() == before and not torch.are_deterministic_algorithms_enabled()
    capsys.readouterr()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train(training={"steps": 3, "checkpoint_every": 1})
    out = capsys.readouterr().out
    assert "resumed with 1 intra-op threads per rank where the run began with 2" in out
    assert "OMP_NUM_THREADS=2" in out


def test_a_pinned_block_runs_deterministic_kernels_without_filling_fresh_tensors_and_gives_the_settings_back():
    """The fill cost the runner about 3 % of a small model's step (benchmarks/loop_overhead.py) and buys nothing
    here: the bitwise resume (tests/train/test_runner.py) holds without it."""
    import torch.utils.deterministic as deterministic

    from toolkit.launch.determinism import pinned

    threads, fill = torch.get_num_threads(), deterministic.fill_uninitialized_memory
    with pinned(1, "cpu"):
        assert torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == 1
        assert deterministic.fill_uninitialized_memory is False
    assert torch.get_num_threads() == threads and deterministic.fill_uninitialized_memory is fill
    assert not torch.are_deterministic_algorithms_enabled()
