"""What a GPU's kernels achieve, from kernel-level measurements (toolkit/data/kernels.yaml), never from training runs.

    prof = kernel_profile("H100-SXM")
    gemm_s(8192, 4096, 4096, peak_flops, memory_bw, 2, prof)        # one product's seconds
    attention_fraction(prof, "fa2", seq_len, head_dim, causal)    # share of peak, forward + backward

A product runs at the device's best matmul rate (MAMF) where its output tiles fill every SM; its tiles go to the
SMs in waves, so a last, part-filled wave idles the rest; it cannot beat moving its operands; and each product
pays a fixed time (set-up, prologue, epilogue). Fused attention runs at the rate its own paper measured for its
sequence, head size and mask. Element-wise kernels stream at the bandwidth a streaming benchmark achieves.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..specs.errors import SpecError

__all__ = [
    "KernelProfile",
    "kernel_profile",
    "gemm_s",
    "attention_fraction",
    "attention_kernel_of",
    "FA_BACKWARD_FACTOR",
]

KERNELS_FILE = Path(__file__).resolve().parents[1] / "data" / "kernels.yaml"

FA_BACKWARD_FACTOR = 2.5
"""FlashAttention counts its backward as 2.5× its forward (two products forward, five backward with the
recomputed scores: FlashAttention-2 paper, §4.1); its TFLOP/s tables are in that count."""


@dataclass(frozen=True)
class KernelProfile:
    name: str
    sms: int
    gemm_fraction: float
    """Best achieved matmul rate over the dense 16-bit peak (MAMF)."""
    gemm_fixed_s: float
    gemm_tile: tuple[int, int]
    memory_fraction: float
    """Achieved share of the datasheet memory bandwidth."""
    host_op_s: float
    """Host cost of one eager tensor operation; shows where the device's work per operation is shorter."""
    attention_default: dict
    """The fused attention each backend runs on this device (torch, megatron, deepspeed)."""
    attention_peak_flops: float
    attention: dict
    """implementation -> [{head_dim, causal, tflops: [...]}] over seq_lens."""
    seq_lens: tuple[int, ...]
    gemm_fraction_fp8: float | None = None
    """Best achieved FP8 matmul rate over the FP8 dense peak (MAMF), where the device has FP8 units."""
    power_limited_fraction: float = 1.0
    """A matmul's rate held for minutes at the power limit over its burst rate (MAMF): training's matmuls run at
    the lower clock, a short benchmark's at boost (MSMF over MAMF, kernels.yaml)."""
    sustained_fraction: float = 1.0
    """Share of the kernels' benchmarked rates a whole training step sustains beyond the power-limited clocks
    (kernels interleaved with others and with the host): the one figure FITTED ON TRAINING RUNS (kernels.yaml says which;
    benchmarks/steptime_accuracy.py refits it leaving each source out)."""


@functools.cache
def _profiles() -> dict[str, KernelProfile]:
    data = yaml.safe_load(KERNELS_FILE.read_text())
    out = {}
    for row in data["profiles"]:
        prof = KernelProfile(
            name=row["name"],
            sms=row["sms"],
            gemm_fraction=row["gemm_fraction"],
            gemm_fixed_s=float(row["gemm_fixed_s"]),
            gemm_tile=tuple(row["gemm_tile"]),
            memory_fraction=row["memory_fraction"],
            host_op_s=float(row["host_op_s"]),
            attention_default=row["attention_default"],
            attention_peak_flops=row["attention_peak_tflops"] * 1e12,
            attention=row["attention"],
            seq_lens=tuple(data["seq_lens"]),
            sustained_fraction=data["sustained_fraction"],
            gemm_fraction_fp8=row.get("gemm_fraction_fp8"),
            power_limited_fraction=row.get("power_limited_fraction", 1.0),
        )
        for name in row["accelerators"]:
            out[name.lower()] = prof
    return out


def kernel_profile(accelerator: str) -> KernelProfile | None:
    """The kernel profile of a catalog accelerator (by its catalog name), or None where none was measured."""
    return _profiles().get(accelerator.lower())


def gemm_s(m, k, n, peak_flops: float, memory_bw_bytes_per_s: float, elem_bytes: float, prof: KernelProfile):
    """Seconds of one (m×k)·(k×n) product: its FLOPs at the best matmul rate, slowed by the idle SMs of its last
    wave of output tiles, or its operands' bytes at achieved bandwidth, whichever is longer, plus a fixed time.
    Dimensions may be numpy arrays."""
    tm, tn = prof.gemm_tile
    tiles = np.ceil(np.asarray(m) / tm) * np.ceil(np.asarray(n) / tn)
    fill = tiles / (np.ceil(tiles / prof.sms) * prof.sms)
    flop_s = 2.0 * m * k * n / (peak_flops * prof.gemm_fraction * fill)
    bytes_s = elem_bytes * (m * k + k * n + m * n) / memory_bw_bytes_per_s
    return np.maximum(flop_s, bytes_s) + prof.gemm_fixed_s


def attention_kernel_of(prof: KernelProfile, backend: str, chosen: str | None) -> str:
    """The fused attention implementation a layout runs: the job's choice, else the backend's usual one here."""
    impl = chosen or prof.attention_default[backend]
    if impl not in prof.attention:
        raise SpecError(
            "memory.attention_kernel",
            impl,
            f"has no kernel measurement on {prof.name} GPUs; measured there: {', '.join(sorted(prof.attention))}",
        )
    return impl


def attention_fraction(prof: KernelProfile, impl: str, seq_len, head_dim: int, causal: bool):
    """Share of the 16-bit peak the fused attention's forward and backward reach (in FlashAttention's FLOP
    count), interpolated over the measured sequence lengths (log scale, held flat beyond them), at the nearest
    measured head size."""
    rows = [r for r in prof.attention[impl] if r["causal"] == causal]
    row = min(rows, key=lambda r: (abs(np.log2(r["head_dim"] / head_dim)), -r["head_dim"]))
    tflops = np.interp(np.log2(np.asarray(seq_len, dtype=float)), np.log2(prof.seq_lens), row["tflops"])
    return tflops * 1e12 / prof.attention_peak_flops
