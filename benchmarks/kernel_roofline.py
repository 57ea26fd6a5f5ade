"""How well a smoothed roofline times published matmul kernels: `python benchmarks/kernel_roofline.py`

Each row of benchmarks/reference/gemm_kernels.json (cuBLAS, CUTLASS and DeepGEMM timings on H100/H800 at serving
shapes, M = 1 to 4,096) is timed as the serving clock times a matmul on the H100 kernel profile: its FLOPs at the
profile's matmul rate, its bytes at the profile's bandwidth, combined as (t_flops^p + t_bytes^p)^(1/p) plus the
kernel's fixed time. Prints the error of each p tried and of the one the toolkit uses (serving_time.
ROOFLINE_SMOOTHING); p = infinity is the larger of the two. Kernel-level fitting data only.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from toolkit.estimate.kernels import kernel_profile
from toolkit.estimate.serving_time import ROOFLINE_SMOOTHING, smooth_roofline_s
from toolkit.specs import load_catalog

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "benchmarks" / "reference" / "gemm_kernels.json"
BYTES = {"bf16": 2, "fp8": 1}


def modelled_tflops(row: dict, p: float) -> float:
    """The row's FLOP rate as the serving clock would time it on the H100 SXM's profile."""
    acc = load_catalog().accelerator("H100-SXM")
    prof = kernel_profile("H100-SXM")
    fp8 = row["dtype"] == "fp8"
    peak = acc.peak_flops("fp8" if fp8 else "bf16") * (prof.gemm_fraction_fp8 if fp8 else prof.gemm_fraction)
    bw = acc.memory_bw_bytes_per_s * prof.memory_fraction
    m, n, k, g, b = row["m"], row["n"], row["k"], row["groups"], BYTES[row["dtype"]]
    flops = 2.0 * m * n * k * g
    seconds = smooth_roofline_s(flops / peak, g * (n * k + m * (n + k)) * b / bw, p) + prof.gemm_fixed_s
    return flops / seconds / 1e12


def rows() -> list[dict]:
    data = json.loads(ROWS.read_text())
    return [dict(zip(data["columns"], r)) for r in data["rows"]]


def errors(p: float) -> list[float]:
    return [modelled_tflops(r, p) / r["tflops"] - 1 for r in rows()]


def main() -> None:
    for r in rows():
        e_max, e_p = (
            modelled_tflops(r, math.inf) / r["tflops"] - 1,
            modelled_tflops(r, ROOFLINE_SMOOTHING) / r["tflops"] - 1,
        )
        print(
            f"{r['id']:26s} m {r['m']:5d}  measured {r['tflops']:7.1f} TFLOP/s  larger-of {e_max:+6.1%}  smoothed {e_p:+6.1%}"
        )
    print()
    for p in (1.5, 2, 3, 4, 6, math.inf):
        e = errors(p)
        print(f"p {p:>6g}: mean |error| {statistics.mean(map(abs, e)):.1%}  mean {statistics.mean(e):+.1%}")
    print()
    print(f"roofline_p: {ROOFLINE_SMOOTHING:g}")
    print(f"kernel_rows: {len(rows())}")
    print(f"smoothed_mean_abs_error_pct: {100 * statistics.mean(map(abs, errors(ROOFLINE_SMOOTHING))):.1f}")
    print(f"larger_of_mean_abs_error_pct: {100 * statistics.mean(map(abs, errors(math.inf))):.1f}")


if __name__ == "__main__":
    main()
