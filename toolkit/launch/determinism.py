"""Same job, same bits: what a training rank fixes before it does any arithmetic, so that a rerun, a resume and a
run beside other load give identical losses and gradient norms (on CPU).

A floating-point sum depends on its order, and on CPU a kernel's order follows how many threads split its work.
torch pins its OpenMP team, but oneMKL (its CPU BLAS) may change the number of threads a matrix product uses while
it runs unless MKL_DYNAMIC is FALSE, and torch turns that off only when `torch.set_num_threads` is called: a rank
that never calls it computes gradients whose last bits can depend on what else the machine is doing. Intel's
conditions for run-to-run reproducibility are a fixed number of threads with MKL_DYNAMIC and OMP_DYNAMIC FALSE
(oneMKL Developer Guide, "Reproducibility Conditions", 2025). So, by construction:

- every rank's environment sets MKL_DYNAMIC=FALSE and OMP_DYNAMIC=FALSE before torch is imported (the launcher's
  ranks, and `python -m toolkit.train.worker` started by torchrun or by hand);
- every run calls `torch.set_num_threads(n)` with n fixed per rank: OMP_NUM_THREADS when set, else the machine's
  cores divided by the ranks on it; the checkpoint records n and a resume with another n says that its last bits
  may differ from an uninterrupted run;
- `torch.use_deterministic_algorithms(True)` on CPU (warn-only: an op without a deterministic kernel warns),
  without torch's filling of fresh tensors (`torch.utils.deterministic.fill_uninitialized_memory`, on by default
  with it): the filling only makes a read of memory nothing wrote repeatable, the program makes no such read (its
  resumes are bitwise without it, tests/train/test_runner.py), and filling what torch.empty and its kin make
  before the ops write it cost the runner about 3 % of a small model's step on CPU (benchmarks/loop_overhead.py);
- the data order, dropout masks and evaluation windows come from seeded generators (toolkit.train.data, loop).

GPU runs get the same thread pinning; cuBLAS and cuDNN determinism is not forced (it costs speed and needs
CUBLAS_WORKSPACE_CONFIG): a GPU resume is exact in its state, not necessarily in its last bits.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["PINNED_ENV", "pin_environment", "rank_threads", "pinned", "threads_note"]

PINNED_ENV = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}
"""Read by oneMKL and OpenMP when they load: set before torch is imported."""


def rank_threads(ranks_on_machine: int, cores: int | None = None) -> int:
    """Intra-op threads for one rank: OMP_NUM_THREADS when the user set it, else the cores shared out."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (cores or os.cpu_count() or 1) // max(1, ranks_on_machine))


def pin_environment(env: dict, ranks_on_machine: int) -> dict:
    """`env` with the pinned variables and this rank's thread count added (a user's own settings win)."""
    pinned_env = {**PINNED_ENV, **env}
    if not env.get("OMP_NUM_THREADS"):
        pinned_env["OMP_NUM_THREADS"] = str(rank_threads(ranks_on_machine))
    return pinned_env


@contextlib.contextmanager
def pinned(threads: int, device_type: str):
    """Run the block with `threads` intra-op threads (MKL's dynamic adjustment off) and deterministic kernels on
    CPU; the process's settings come back afterwards (a notebook kernel trains in-process)."""
    import torch
    import torch.utils.deterministic as deterministic

    before_threads, before_fill = torch.get_num_threads(), deterministic.fill_uninitialized_memory
    before_det, before_warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.set_num_threads(threads)  # (also mkl_set_dynamic(false): ATen's ParallelOpenMP.cpp)
    if device_type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
        deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.set_num_threads(before_threads)
        torch.use_deterministic_algorithms(before_det, warn_only=before_warn)
        deterministic.fill_uninitialized_memory = before_fill


def threads_note(saved: int | None, now: int) -> str | None:
    """A line when a resume runs with another thread count than the checkpoint's run did."""
    if saved is None or saved == now:
        return None
    return (
        f"resumed with {now} intra-op threads per rank where the run began with {saved}: its sums split "
        f"differently, so losses may differ from an uninterrupted run in the last bits (set OMP_NUM_THREADS="
        f"{saved} to continue bit for bit)"
    )
