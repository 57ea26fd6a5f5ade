"""Serving engines' scheduler defaults, read from toolkit/data/engines.yaml (each value sourced and dated there):
what a job leaves unset under `serving.engine: vllm | sglang | trtllm` takes its engine's value.

    engine = engine_defaults("sglang")      # Engine(max_num_seqs=..., max_batched_tokens=..., host_s_per_step=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from .catalog import DATA_DIR
from .errors import SpecError
from .yamlio import read_yaml

__all__ = ["Engine", "ENGINES", "engine_defaults"]

ENGINES = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    max_num_seqs: int
    max_batched_tokens: int
    block_size: int
    memory_fraction: float
    host_s_per_step: float
    """The engine's CPU time per step left on the critical path (scheduling, input preparation, sampling): zero
    where the engine overlaps it with the GPU's previous step."""
    host_overlapped: bool
    mixed_batches: bool = True
    """A step carries decodes and prompt chunks together (vLLM's token budget, TensorRT-LLM's in-flight batching);
    False: prefill batches run on their own and the decodes wait (SGLang's default, enable_mixed_chunk off)."""


@cache
def _table() -> dict:
    return read_yaml(DATA_DIR / "engines.yaml", what="engine table")["engines"]


def engine_defaults(name: str, device: str | None = None, memory_gib: float | None = None) -> Engine:
    """The engine's defaults on a device (its name and memory: vLLM's and SGLang's defaults depend on both); one line
    naming the allowed engines for an unknown one."""
    rows = _table()
    if name not in rows:
        raise SpecError("serving.engine", name, f"allowed: {', '.join(sorted(rows))}")
    row = rows[name]
    overlapped = bool(row.get("host_overlapped", False))
    seqs, tokens = int(row["max_num_seqs"]), int(row["max_num_batched_tokens"])
    small = row.get("smaller_gpu")
    if small and memory_gib is not None:
        named = any(n in (device or "").lower() for n in small.get("names", ()))
        if memory_gib < small["below_gib"] or named:
            seqs, tokens = int(small["max_num_seqs"]), int(small["max_num_batched_tokens"])
    if row.get("chunk_by_memory_gib") and memory_gib is not None:
        tokens = next(int(t) for below, t in row["chunk_by_memory_gib"] if memory_gib < below)
    return Engine(
        name=name,
        label=str(row.get("label", name)),
        max_num_seqs=seqs,
        max_batched_tokens=tokens,
        block_size=int(row["block_size"]),
        memory_fraction=float(row["memory_fraction"]),
        host_s_per_step=0.0 if overlapped else float(row.get("host_s_per_step") or 0.0),
        host_overlapped=overlapped,
        mixed_batches=bool(row.get("mixed_batches", True)),
    )
