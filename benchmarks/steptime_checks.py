"""The step-time model against published training runs: modelled MFU beside the published one.

    .venv/bin/python benchmarks/steptime_checks.py

Runs and figures from shared/reference/facts.md (section 4, MFU records), layouts from the papers
named. The model has one calibrated constant (Assumptions.gemm_fraction, fitted to the first row);
the other rows are checks. A row marked `approx` differs from the real run where the model cannot
follow it (Llama 3 puts fewer layers on its first and last stages: 126 layers on 16 stages; we
model 128 layers, 8 per stage).
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.estimate.hardware import hardware_for  # noqa: E402
from toolkit.estimate.steptime import step_time  # noqa: E402
from toolkit.specs import Job, load_catalog  # noqa: E402

RUNS = [
    # name, published MFU, job, note
    (
        "Megatron 1T, selective recompute + SP (calibration)",
        0.563,
        {
            "model": {"preset": "megatron-1t"},
            "parallel": {"tp": 8, "pp": 64, "sp": True},
            "cluster": {"accelerator": "A100-80GB", "count": 512},
            "precision": {"mode": "mixed-bf16"},
            "memory": {"recompute": "selective", "attention": "eager"},
        },
        "Korthikanti et al. 2022 (arXiv 2205.05198): 56.3 % MFU, tp 8, pp 64, dp 1, batch 512",
    ),
    (
        "Llama 3 405B on 8,192 H100 (approx)",
        0.43,
        {
            "model": {"preset": "llama3-405b", "layers": 128, "seq_len": 8192},
            "parallel": {"tp": 8, "pp": 16, "vpp": 2, "sp": True},
            "cluster": {"accelerator": "H100-SXM", "count": 8192},
            "precision": {"mode": "mixed-bf16"},
            "batch": {"micro_batch": 1, "global_batch": 2048},
        },
        "Dubey et al. 2024 (arXiv 2407.21783) Table 4: 38-43 % MFU; 43 % at 8,192 GPUs, tp 8, pp 16, dp 64, seq 8192",
    ),
    (
        "MT-NLG 530B on 2,240 A100",
        0.302,
        {
            "model": {"preset": "megatron-530b"},
            "parallel": {"tp": 8, "pp": 35},
            "cluster": {"accelerator": "A100-80GB", "count": 2240},
            "precision": {"mode": "mixed-bf16"},
            "batch": {"micro_batch": 1, "global_batch": 1920},
            "memory": {"recompute": "full", "attention": "eager"},
        },
        "PaLM paper Table 3: 30.2 % MFU; Smith et al. 2022 (arXiv 2201.11990): tp 8, pp 35, dp 8, batch 1920",
    ),
]


def main() -> None:
    catalog = load_catalog()
    errors = []
    for name, published, data, source in RUNS:
        job, _ = Job.from_dict(data, catalog).resolve(catalog)
        st = step_time(job, hardware_for(job, catalog))
        error = float(st.mfu) / published - 1
        errors.append(abs(error))
        parts = ", ".join(f"{k[:-2]} {float(v):.2f}" for k, v in st.breakdown().items())
        print(
            f"{name}\n  published {published:.1%}, modelled {float(st.mfu):.1%} ({error:+.0%}); "
            f"step {float(st.step_s):.1f} s = {parts}\n  source: {source}"
        )
    checks = errors[1:]
    print(f"calibration error: {errors[0]:.1%}")
    print(f"median error on the checks: {statistics.median(checks):.0%}")
    print(f"max error on the checks: {max(checks):.0%}")


if __name__ == "__main__":
    main()
