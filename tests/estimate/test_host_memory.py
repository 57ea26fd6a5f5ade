"""Offload against the host's RAM: a node's offloaded states must fit in it (DeepSpeed's estimators report the same
figure), so the planner does not call a 6 TB offload into one 8-GPU box a fit, and the estimate says which RAM it
assumed and how to give the real one."""

import pytest

from toolkit.estimate import estimate
from toolkit.plan import search
from toolkit.specs import Job

OFFLOAD = {
    "model": {"preset": "llama3-70b"},
    "cluster": {"accelerator": "H100-SXM", "count": 16},
    "parallel": {"zero": 3, "offload": "params"},
    "precision": {"mode": "amp-bf16"},
}


def test_llama3_405b_does_not_fit_eight_rtx_4090s_through_offload(catalog):
    job = Job.from_dict({"model": {"preset": "llama3-405b"}, "tokens": 1e9}, catalog)
    result = search(job, catalog, gpus=(8, "RTX-4090"))
    assert result["fitting"] == 0


def test_a_node_holds_its_devices_offloaded_states(catalog):
    mem = estimate(Job.from_dict(OFFLOAD, catalog), catalog)["memory"]
    assert mem["host_bytes_per_node"] == pytest.approx(8 * mem["host_bytes"])  # 8 devices a node
    assert mem["host_memory_source"] == "accelerator"  # DGX H100's 2 TB, 80 % usable
    assert mem["host_usable_bytes_per_node"] == pytest.approx(0.8 * 2048 * 2**30)


def test_too_little_host_memory_is_not_a_fit_and_says_the_fix(catalog):
    small = {**OFFLOAD, "cluster": {**OFFLOAD["cluster"], "host_memory_gib": 256}}
    result = estimate(Job.from_dict(small, catalog), catalog)
    assert result["memory"]["fits"] is False
    assert any("host memory" in n and "--host-memory-gib" in n for n in result["notes"])


def test_no_plan_needs_more_host_memory_than_its_node_has(catalog):
    job = Job.from_dict(
        {"model": {"preset": "llama3-70b"}, "tokens": 1e9, "cluster": {"host_memory_gib": 512}}, catalog
    )
    plans = search(job, catalog, gpus=(8, "H100-SXM"), top=20)["plans"]
    assert all(p["host_bytes_per_node"] <= 0.8 * 512 * 2**30 for p in plans)
