"""The estimate's typed parts and its JSON contract are one thing: same keys, same order, same values."""

import dataclasses
import json

import pytest

from toolkit.estimate import Estimate, estimate, estimate_result
from toolkit.specs import Job

JOBS = {
    "gpt3-on-p4de": {
        "model": {"preset": "gpt3-175b"},
        "tokens": 300e9,
        "mfu": 0.45,
        "precision": {"mode": "mixed-bf16"},
        "parallel": {"tp": 8, "pp": 16, "zero": 1},
        "cost": {"offer": "p4de.24xlarge"},
        "cluster": {"accelerator": "A100-80GB", "count": 1024},
    },
    "llama-spot": {
        "model": {"preset": "llama2-7b"},
        "tokens": 1e11,
        "cost": {"offer": "p5.48xlarge", "spot": True},
        "cluster": {"count": 16},
    },
    "size-only": {"model": {"params": 7e9}, "cluster": {"accelerator": "A100-80GB", "count": 8}},
}


@pytest.mark.parametrize("name", JOBS)
def test_typed_parts_are_the_json_contract(name):
    job = Job.from_dict(JOBS[name])
    data, result = estimate(job), estimate_result(job)
    assert result.to_dict() == data
    assert json.dumps(Estimate.from_dict(data).to_dict()) == json.dumps(data)  # key order too
    for part in ("model", "memory", "compute", "time", "cost"):
        assert list(data[part]) == [f.name for f in dataclasses.fields(getattr(result, part))], part


def test_a_traced_estimate_reads_back_with_its_gaps_as_none():
    partial = {"memory": {"peak_bytes": 5.0, "trace_only_key": 1}, "notes": ["n"]}
    result = Estimate.from_dict(partial)
    assert result.memory.peak_bytes == 5.0 and result.memory.fits is None and result.time.step_s is None
