"""The load simulation against queueing theory and the steady-state formula: one request at a time it is an M/D/1
queue, whose mean wait Pollaczek-Khinchine gives; with requests in flight its time per output token rises with the
arrival rate before saturation, and at a fixed concurrency it agrees with the quick path."""

import time

import numpy as np
import pytest

from toolkit.estimate.serving_sim import Load, StepTable, arrivals, simulate


def constant_table(prefill_s: float, decode_s: float) -> StepTable:
    rows = np.array([1.0, 4096.0])
    return StepTable(rows, np.full(2, decode_s), np.full(2, prefill_s), 0.0, 0.0, 0.0)


def test_one_at_a_time_is_an_m_d_1_queue():
    prefill_s, decode_s, out = 0.02, 0.001, 50
    service_s = prefill_s + (out - 1) * decode_s  # deterministic: every request alike
    rate = 0.7 / service_s  # utilisation 0.7
    load = arrivals(requests=20000, input_tokens=100, output_tokens=out, rate=rate, seed=1)
    sim = simulate(constant_table(prefill_s, decode_s), load, max_num_seqs=1, max_batched_tokens=4096, kv_tokens=1e9)
    rho = rate * service_s
    wait_s = rho * service_s / (2 * (1 - rho))  # Pollaczek-Khinchine, deterministic service
    assert sim["ttft_s"]["mean"] - prefill_s == pytest.approx(wait_s, rel=0.05)
    assert sim["tpot_s"]["p50"] == pytest.approx(decode_s, rel=1e-9)


def test_a_closed_loop_of_one_is_the_requests_back_to_back():
    load = Load(np.full(10, 100), np.full(10, 11), concurrency=1)
    sim = simulate(constant_table(0.02, 0.001), load, max_num_seqs=8, max_batched_tokens=4096, kv_tokens=1e9)
    assert sim["e2e_s"]["mean"] == pytest.approx(0.02 + 10 * 0.001)
    assert sim["duration_s"] == pytest.approx(10 * 0.03)


def test_the_kv_cache_bounds_what_runs_at_once():
    load = Load(np.full(8, 100), np.full(8, 100), concurrency=8)
    free = simulate(constant_table(0.01, 0.001), load, max_num_seqs=8, max_batched_tokens=4096, kv_tokens=1e9)
    tight = simulate(constant_table(0.01, 0.001), load, max_num_seqs=8, max_batched_tokens=4096, kv_tokens=400)
    assert tight["duration_s"] > 3 * free["duration_s"]  # two requests' tokens fit at a time, not eight


@pytest.fixture(scope="module")
def llama70b_table(catalog):
    from toolkit.estimate.serving_time import ServingClock, serving_hardware
    from toolkit.specs import Job

    job = Job.from_dict(
        {
            "workload": "inference",
            "model": {"preset": "llama3-70b"},
            "cluster": {"accelerator": "H100-SXM", "count": 4},
            "parallel": {"tp": 4},
            "serving": {"weights": "fp8", "input_tokens": 467, "output_tokens": 256, "concurrency": 64},
        },
        catalog,
    ).resolve(catalog)[0]
    clock = ServingClock(job, serving_hardware(job, catalog))
    return clock, StepTable.of(clock, 8192 + 1024)


def test_time_per_token_rises_with_the_rate_before_saturation(llama70b_table):
    _clock, table = llama70b_table
    tpot, served = [], []
    for rate in (1, 4, 16):
        load = arrivals(requests=2000, input_tokens=467, output_tokens=256, rate=rate)
        sim = simulate(table, load, max_num_seqs=1024, max_batched_tokens=8192, kv_tokens=7e5)
        tpot.append(sim["tpot_s"]["mean"])
        served.append(sim["requests_per_s"])
    assert tpot[0] < tpot[1] < tpot[2]
    assert served[2] == pytest.approx(16, rel=0.1)  # not saturated: it keeps up with the arrivals


def test_a_fixed_concurrency_agrees_with_the_steady_state(llama70b_table):
    clock, table = llama70b_table
    load = arrivals(requests=640, input_tokens=467, output_tokens=256, concurrency=64)
    sim = simulate(table, load, max_num_seqs=1024, max_batched_tokens=8192, kv_tokens=7e5)
    assert sim["tpot_s"]["mean"] == pytest.approx(clock.steady(64)["tpot_s"], rel=0.15)


def test_ten_thousand_requests_simulate_in_about_a_second(llama70b_table):
    _clock, table = llama70b_table
    load = arrivals(requests=10000, input_tokens=467, output_tokens=256, rate=8)
    start = time.perf_counter()
    simulate(table, load, max_num_seqs=1024, max_batched_tokens=8192, kv_tokens=7e5)
    assert time.perf_counter() - start < 2.0  # 0.5 s alone on this 2-core machine; slack for a loaded test run


def test_the_load_curve_rises_to_saturation(catalog):
    from toolkit.estimate.serving import load_curve
    from toolkit.specs import Job

    job = Job.from_dict(
        {"workload": "inference", "model": {"preset": "llama2-7b"}, "cluster": {"accelerator": "A100-80GB"},
         "serving": {"input_tokens": 512, "output_tokens": 128}},
        catalog,
    ).resolve(catalog)[0]  # fmt: skip
    points = load_curve(job, catalog)
    tpot = [p["tpot_s"]["p50"] for p in points]
    assert tpot == sorted(tpot) and tpot[-1] > 1.5 * tpot[0]
    assert not points[0]["saturated"] and points[-1]["saturated"]  # past the steady throughput the queue grows
