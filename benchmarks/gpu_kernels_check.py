"""On a GPU: the kernel profile (toolkit/data/kernels.yaml) against this device's own kernels.

    .venv/bin/python benchmarks/gpu_kernels_check.py --accelerator H100-SXM

Times bf16 products at OpenXLA's table shapes and at a model's forward, input- and weight-gradient shapes,
torch's SDPA (FlashAttention-2 on most GPUs) forward + backward at the FlashAttention papers' shapes (16k tokens,
hidden 2048), and a streaming copy; prints each beside the profile's figure. Needs CUDA; prints one line and
exits 2 without it. Not yet run: no GPU has been lent to this project.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GEMMS = [
    (1024, 2048, 2048),
    (2048, 2048, 2048),
    (4096, 1024, 4096),
    (4096, 4096, 4096),
    (8192, 4096, 4096),
    (8192, 4096, 11008),
    (8192, 11008, 4096),
    (4096, 8192, 8192),
]
ATTENTION = [(2048, 128, True), (4096, 128, True), (8192, 128, True), (8192, 64, False)]


def timed_s(fn, rounds: int = 20) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", required=True, help="the catalog name of this GPU, e.g. H100-SXM")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("gpu_kernels_check: no CUDA device here; run it on a GPU host", file=sys.stderr)
        return 2
    from toolkit.estimate.kernels import attention_fraction, gemm_s, kernel_profile
    from toolkit.specs import load_catalog

    acc = load_catalog().accelerator(args.accelerator)
    prof = kernel_profile(acc.name)
    peak, bw = acc.peak_flops("bf16"), acc.memory_bw_bytes_per_s * prof.memory_fraction
    errors = []
    for m, n, k in GEMMS:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        measured = timed_s(lambda: a @ b)  # noqa: B023 - called in this iteration
        modelled = float(gemm_s(m, k, n, peak, bw, 2, prof))
        errors.append(modelled / measured - 1)
        print(
            f"gemm {m}x{n}x{k}: measured {2 * m * n * k / measured / 1e12:.0f} TFLOP/s, "
            f"modelled {2 * m * n * k / modelled / 1e12:.0f} ({errors[-1]:+.1%})"
        )
    for seq, d, causal in ATTENTION:
        heads, batch = 2048 // d, 16384 // seq
        q, k, v = (
            torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )

        def step():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()  # noqa: B023

        flops = 3.5 * 4 * batch * seq * seq * d * heads / (2 if causal else 1)
        measured = flops / timed_s(step)
        modelled = float(attention_fraction(prof, "fa2", seq, d, causal)) * peak
        errors.append(measured / modelled - 1)
        print(
            f"sdpa seq {seq} d {d} causal {causal}: measured {measured / 1e12:.0f} TFLOP/s fwd+bwd, "
            f"fa2 table {modelled / 1e12:.0f}"
        )
    x = torch.empty(2**28, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_bw = 2 * x.numel() * 2 / timed_s(lambda: y.copy_(x))
    print(f"copy: measured {copy_bw / 1e9:.0f} GB/s, profile {bw / 1e9:.0f} GB/s")
    print(f"kernel mean |error|: {100 * statistics.mean(abs(e) for e in errors):.1f} %")
    print(f"kernel max |error|: {100 * max(abs(e) for e in errors):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
