"""Every preset on every kind of accelerator, in many layouts: an estimate or a one-line refusal, never a crash."""

import itertools

from toolkit.estimate import estimate
from toolkit.specs import Job, SpecError, load_catalog
from toolkit.views.text import render_estimate


def test_no_combination_crashes():
    catalog = load_catalog()
    outcomes = {"estimated": 0, "refused": 0}
    for preset, accelerator, mode, zero, (tp, pp) in itertools.product(
        catalog.presets,
        ("A100-80GB", "V100-32GB", "TPU-v5e", "DCU-Z100"),
        ("amp-bf16", "mixed-fp16"),
        (0, 3),
        ((1, 1), (8, 4)),
    ):
        data = {
            "model": {"preset": preset},
            "cluster": {"accelerator": accelerator, "count": 64},
            "precision": {"mode": mode},
            "parallel": {"zero": zero, "tp": tp, "pp": pp},
            "memory": {"recompute": "full"},
            "mfu": 0.4,
            "cost": {},
        }
        try:
            text = render_estimate(estimate(Job.from_dict(data, catalog), catalog))
        except SpecError as err:
            assert "\n" not in str(err) and "=" in str(err)
            outcomes["refused"] += 1
        else:
            assert "parameters" in text
            outcomes["estimated"] += 1
    # bf16 on V100/DCU, fp16 on TPUs, tp 8 on 12-head models... are refused; the rest estimate
    assert outcomes["estimated"] > 300 and outcomes["refused"] > 100, outcomes
