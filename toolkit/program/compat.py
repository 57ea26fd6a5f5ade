"""The private torch internals the tracer and the runner's memory recorder touch, in one place, with the versions
they were checked on.

    from ..compat import MemTracker, require_internals, version_note

torch keeps these under leading underscores (`torch.distributed._tools`, `torch.testing._internal`,
`torch.distributed.tensor._sharding_prop`) and may move them in any release; `pyproject.toml` allows any newer
torch. On a torch without them `toolkit trace` and `compare` say so in one line, a training run skips its
memory record and says why, and `estimate`, `plan` and `train` never refuse over a version. DeepSpeed's and
bitsandbytes' public APIs are used as they are; the versions they were checked on are listed here too.
"""

from __future__ import annotations

import importlib.util
import sys

import torch

from ..specs.errors import SpecError

__all__ = [
    "CHECKED",
    "PROBLEM",
    "FakeStore",
    "FakeTensorMode",
    "FSDPMemTracker",
    "MemTracker",
    "MemRefType",
    "sharding_prop",
    "require_internals",
    "version_note",
]

CHECKED = {"torch": "2.13", "deepspeed": "0.19", "accelerate": "1.15"}
"""Versions the tracer's internals and the runner were tested with (CI: the CPU build of torch 2.13)."""


class _Missing:
    """Stands in for an internal this torch lacks, so that modules still import; using it says why."""

    def __init__(self, *args, **kwargs):
        require_internals("this measurement")


def _tools_without_their_index() -> None:
    """Register torch.distributed._tools without running its __init__, which imports every tool in the package:
    its runtime estimator pulls in torch._inductor and torch._dynamo, 0.6 s of each training rank's start that
    MemTracker and FSDPMemTracker never use. Submodules still import (the package keeps its path); nothing in
    torch imports names from the package itself (checked on 2.13). Any failure leaves the normal import."""
    name = "torch.distributed._tools"
    if name in sys.modules:
        return
    try:
        import torch.distributed

        spec = importlib.util.find_spec(name)
        package = importlib.util.module_from_spec(spec)
    except (ImportError, AttributeError, ValueError):
        return
    sys.modules[name] = package
    torch.distributed._tools = package


_tools_without_their_index()
try:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.mem_tracker import _MemRefType as MemRefType
    from torch.distributed.tensor import _sharding_prop as sharding_prop
    from torch.testing._internal.distributed.fake_pg import FakeStore

    PROBLEM: str | None = None
except (ImportError, AttributeError) as err:  # moved or renamed in this torch
    FakeTensorMode = FSDPMemTracker = MemTracker = FakeStore = _Missing
    MemRefType = sharding_prop = None
    PROBLEM = f"{type(err).__name__}: {err}"


def require_internals(what: str = "the trace") -> None:
    """Refuse, in one line, to run a measurement this torch lacks the internals for."""
    if PROBLEM is not None:
        raise SpecError(
            "torch",
            torch.__version__,
            f"{what} uses torch internals this version lacks ({PROBLEM}); it was checked on torch "
            f"{CHECKED['torch']}: install that to trace (estimate, plan and train work as they are)",
        )


def version_note() -> str | None:
    """A line when this torch is not the one the internals were checked on (their figures may drift)."""
    running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if running == CHECKED["torch"]:
        return None
    return (
        f"torch {torch.__version__}: the tracer's internals were checked on {CHECKED['torch']}; traced and "
        "recorded figures may drift on this version"
    )
