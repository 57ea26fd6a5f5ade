"""A Mixture of Experts' time against kernel- and collective-level measurements (not training runs): the
all-to-all against DeepEP's measured dispatch and combine bandwidths, the grouped GEMM's thin-row slowdown against
DeepGEMM's grouped kernels, the FLOPs against the official active parameter count; and the planner searching
expert parallelism. Memory against the traced program: tests/trace/test_moe_trace.py; on gloo ranks:
tests/train/test_moe.py."""

from pathlib import Path

import pytest

from toolkit.estimate import estimate
from toolkit.estimate.hardware import Assumptions, Hardware
from toolkit.estimate.moe import GROUPED_GEMM_HALF_ROWS, all_to_all_s, expert_load
from toolkit.specs import Job, load_catalog
from toolkit.specs.hf_config import model_from_hf_config

HF = Path(__file__).parents[1] / "fixtures" / "hf"
CATALOG = load_catalog()

H800 = Hardware(
    peak_flops=989e12,
    memory_bw_bytes_per_s=3.35e12,
    intra_bw_bytes_per_s=200e9,  # NVLink 400 GB/s both ways (the H800's export cut)
    inter_bw_bytes_per_s=50e9,  # one ConnectX-7 400 Gb/s NIC per GPU
    gpus_per_node=8,
)
"""DeepEP's test machine (its README: H800, ~160 GB/s NVLink achieved, CX7 InfiniBand 400 Gb/s, ~50 GB/s)."""

DEEPEP = [  # (ep ranks, dispatch GB/s, combine GB/s): deepseek-ai/DeepEP docs/legacy.md, "Normal kernels"
    (8, 153, 158),  # intranode, NVLink bandwidth
    (16, 43, 43),  # internode, RDMA bandwidth
    (32, 58, 57),
    (64, 51, 50),
]
"""4,096 tokens a batch, hidden 7,168, top-8 (FP8 dispatch, BF16 combine)."""


@pytest.mark.parametrize("ep, dispatch, combine", DEEPEP, ids=[f"ep{e}" for e, *_ in DEEPEP])
def test_the_all_to_all_moves_tokens_at_deepeps_measured_bandwidth(ep, dispatch, combine):
    """Bandwidth as DeepEP counts it: inside a node the bytes for other GPUs over the time; across nodes the bytes
    that leave the node over the time. Within 5 % inside a node; across nodes within 25 % (DeepEP's own figures
    spread from 43 to 58 GB/s over one 50 GB/s NIC: it forwards through NVLink, which the model does not)."""
    size = 4096 * 8 * 7168 * 1  # one rank's dispatch (FP8)
    seconds = float(all_to_all_s(size, ep, 1, H800, Assumptions()))
    per_node = min(ep, H800.gpus_per_node)
    leaving = size * ((per_node - 1) / ep if ep <= 8 else (ep - per_node) / ep)
    modelled = leaving / seconds / 1e9
    for measured in (dispatch, combine):
        assert modelled == pytest.approx(measured, rel=0.05 if ep <= 8 else 0.25)


@pytest.mark.parametrize(
    "rows, measured",
    [(1024, (1233, 925)), (512, (1040, 916)), (256, (932, 815))],
)
def test_thin_expert_matmuls_slow_down_as_deepgemm_measures(rows, measured):
    """DeepGEMM's masked grouped GEMM on H800 (README, 2025-04), against its 8,192-row rate (1,346 and 1,214
    TFLOP/s at N 4,096 K 7,168 and N 7,168 K 2,048): each expert's rate falls as rows / (rows + half) of it. The
    half (128 rows) is fitted to these six kernel-level points; each within 20 % (the worst: one group of 1,024 rows
    at K 2,048, 0.76 measured against 0.90, which fills fewer of the GPU's SMs than the row count alone says; the
    other five within 8 %)."""
    full = (1346, 1214)
    modelled = (1 + GROUPED_GEMM_HALF_ROWS / 8192) / (1 + GROUPED_GEMM_HALF_ROWS / rows)
    for got, base in zip(measured, full):
        assert modelled == pytest.approx(got / base, rel=0.2 if (rows, base) == (1024, 1214) else 0.08)


def test_flops_per_token_are_six_times_the_official_active_parameters():
    """Mixtral 8x7B's 12.9 B active parameters (Mistral AI) times 6 is what a token costs, short of the embedding
    lookup; the router and a short sequence's attention add under 0.2 %."""
    job = Job.from_dict(
        {"model": {"hf_config": str(HF / "mixtral-8x7b"), "seq_len": 128}, "cluster": {"accelerator": "H100-SXM"}},
        CATALOG,
    )
    out = estimate(job, CATALOG)
    embedding = 32000 * 4096
    assert (out["compute"]["model_flops_per_token"] / 6 + embedding) == pytest.approx(12.9e9, rel=0.005)


def test_one_rank_holding_every_expert_takes_exactly_its_tokens():
    """Without expert parallelism the busiest rank is the only one: load 1 whatever the routing; one expert per rank
    takes the busiest expert's load; a capacity factor bounds the work, and sizes the buffers, by itself."""
    model = model_from_hf_config(HF / "mixtral-8x7b")
    assert float(expert_load(model, 1)) == 1.0
    assert float(expert_load(model, 8)) == pytest.approx(1.52)
    capped = model.__class__(**{**model.__dict__, "capacity_factor": 1.25})
    assert float(expert_load(capped, 8)) == 1.25 and float(expert_load(capped, 1, for_memory=True)) == 1.25


def test_the_planner_searches_expert_parallelism():
    """Mixtral on 64 H100s: the planner tries ep with the other axes, and its fastest layout shares the experts out
    (a replica of every expert on each rank does not fit: 47 B parameters), over ep or expert tensor parallelism."""
    from toolkit.plan import search

    job = Job.from_dict({"model": {"preset": "mixtral-8x7b", "seq_len": 4096}, "tokens": 1e12}, CATALOG)
    result = search(job, CATALOG, gpus=(64, "H100-SXM"), top=5)
    assert result["plans"] and all(p["layout"]["ep"] * p["layout"]["etp"] > 1 for p in result["plans"])
    assert {p["layout"]["ep"] for p in result["plans"]} <= {1, 2, 4, 8}


@pytest.mark.parametrize("ep, dispatch, combine", DEEPEP[1:], ids=[f"ep{e}" for e, *_ in DEEPEP[1:]])
def test_deepep_sends_a_token_once_per_node_at_its_measured_rdma_bandwidth(ep, dispatch, combine):
    """DeepEP's internode kernels as DeepEP counts them: the bytes that leave a node (each token once per other
    node holding its experts: top-4 groups, top-8 experts, its benchmark's routing) over the time, within 25 % of
    its measured RDMA bandwidth; and fewer bytes leave than NCCL's all-to-all sends (one copy per expert)."""
    import dataclasses

    from toolkit.estimate.moe import deepep_s, remote_nodes

    model = dataclasses.replace(model_from_hf_config(HF / "deepseek-v3"), max_nodes_per_token=4)
    token_bytes = 4096 * 7168 * 1  # FP8 dispatch
    seconds = float(deepep_s(token_bytes * 8, ep, 1, H800, Assumptions(), model))
    leaving = token_bytes * float(remote_nodes(model, ep // 8))
    for measured in (dispatch, combine):
        assert leaving / seconds / 1e9 == pytest.approx(measured, rel=0.25)
    assert seconds < float(all_to_all_s(token_bytes * 8, ep, 1, H800, Assumptions()))
