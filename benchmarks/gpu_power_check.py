"""On a GPU: the matmul rate held at the power limit (kernels.yaml `power_limited_fraction`) against this device.

    .venv/bin/python benchmarks/gpu_power_check.py --accelerator H100-SXM [--seconds 60]

Runs one bf16 product of random data (8192 x 8448 x 20480, the shape ml-engineering's sustained "MSMF" used) back to
back for `--seconds`, timing each second apart and reading the SM clock and the power draw from nvidia-smi. The
first second's rate is the burst (what MAMF records), the last ten seconds' median the held rate; their ratio is
this device's power-limited fraction, printed beside the profile's. Needs CUDA; prints one line and exits 2
without it. Not yet run: no GPU has been lent to this project. Headline figures last, one per line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = (8192, 8448, 20480)
"""(m, n, k) of the product: ml-engineering's MSMF shape (compute/accelerator/README.md, branch fast-mamf)."""


def clock_and_power() -> str:
    """The SM clock (MHz) and power draw (W) nvidia-smi reports now, or '' where it cannot."""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def rates_per_second(seconds: float) -> list[float]:
    """TFLOP/s of the product, one figure per second of back-to-back products."""
    import torch

    m, n, k = SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * m * n * k
    rates, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start, count = time.monotonic(), 0
        while time.monotonic() - start < 1.0:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            count += 10
        rates.append(count * flops / (time.monotonic() - start) / 1e12)
        print(f"  second {len(rates):3}: {rates[-1]:6.0f} TFLOP/s  (clock MHz, power W: {clock_and_power()})")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", required=True, help="the catalog name of this GPU, e.g. H100-SXM")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to hold the load (at least 15)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_power_check: no CUDA device here; run it on a GPU host", file=sys.stderr)
        return 2
    from toolkit.estimate.kernels import kernel_profile
    from toolkit.specs import load_catalog

    acc = load_catalog().accelerator(args.accelerator)
    prof = kernel_profile(acc.name)
    rates = rates_per_second(max(args.seconds, 15.0))
    burst, held = rates[0], statistics.median(rates[-10:])
    peak = acc.peak_flops("bf16") / 1e12
    print(
        f"profile: MAMF {prof.gemm_fraction * peak:.0f} TFLOP/s, held {prof.gemm_fraction * prof.power_limited_fraction * peak:.0f}"
    )
    print(f"burst_tflops: {burst:.0f}")
    print(f"held_tflops: {held:.0f}")
    print(f"power_limited_fraction_measured: {held / burst:.3f}")
    print(f"power_limited_fraction_profile: {prof.power_limited_fraction:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
