"""The experts' own grid (Megatron-Core's MoE parallel folding, etp × ep × edp over a stage's tp × cp × dp ranks):
accepted where Megatron runs it, and its memory and work checked against independent counts: the parameter count
of the published config, the FLOPs of 6·N_active, and the layout's ranks."""

from pathlib import Path

import pytest

from toolkit.estimate import estimate
from toolkit.estimate.moe import expert_grid
from toolkit.estimate.states import experts_on_stage
from toolkit.specs import Job, SpecError, load_catalog
from toolkit.specs.dims import ParallelDims
from toolkit.specs.hf_config import model_from_hf_config
from toolkit.specs.params import count_params

HF = Path(__file__).parents[1] / "fixtures" / "hf"
CATALOG = load_catalog()
DSV3 = model_from_hf_config(HF / "deepseek-v3")


def _job(devices, precision="mixed-bf16", **parallel):
    return Job.from_dict(
        {
            "model": DSV3.__dict__ | {"seq_len": 4096},
            "cluster": {"accelerator": "H100-SXM", "count": devices},
            "batch": {"global_batch": 8192},
            "precision": {"mode": precision},
            "parallel": parallel,
        },
        CATALOG,
    ).resolve(CATALOG)[0]


def test_ep_may_span_tensor_parallel_ranks_as_megatron_folds_it():
    """Qwen3-235B's published recipe shape: tp 2 with ep as wide as tp · dp (here DeepSeek-V3's 256 experts on 32
    H100: dp 8, so ep 16 spans both tensor-parallel ranks of 8 replicas)."""
    job = _job(32, tp=2, pp=2, ep=16)
    assert job.parallel.dp == 8
    assert ParallelDims.from_job(job).experts_folded
    grid = expert_grid(job)
    assert (int(grid.edp), int(grid.stride), int(grid.token_split)) == (1, 1, 2)
    with pytest.raises(SpecError, match="ep × etp = 64 the tp × cp × dp = 16 ranks"):
        _job(32, tp=2, pp=2, ep=32, etp=2)


def test_a_rank_holds_its_share_of_the_experts_exactly():
    """Routed parameters on a rank = every MoE block's routed experts / (ep · etp), from the config's own count."""
    job = _job(64, tp=2, pp=1, ep=8, etp=2)
    routed = count_params(DSV3).experts_per_layer * DSV3.moe_layers
    assert float(experts_on_stage(job)) == pytest.approx(routed / 16, rel=1e-12)


def test_the_grid_spreads_the_expert_work_over_the_tensor_parallel_ranks():
    """Megatron's program does not repeat the experts on every tp rank: each rank computes and sends its tp share
    of the tokens, and its ep group (etp apart: neighbours) sits inside one node where the plain program's (tp
    apart) spans two, so its all-to-all is less than half the plain one's."""
    folded = estimate(_job(64, tp=2, pp=1, ep=8), CATALOG)["time"]
    plain = estimate(_job(64, precision="amp-bf16", tp=2, pp=1, ep=8), CATALOG)["time"]
    assert folded["breakdown"]["compute_s"] < plain["breakdown"]["compute_s"]
    assert folded["breakdown"]["ep_comm_s"] < plain["breakdown"]["ep_comm_s"] / 2


def test_megatrons_recipe_memory_options():
    """The precision-aware optimizer's bf16 moments take 2 + 2 bytes where fp32 moments take 4 + 4 (the fp32
    master copy stays: 8 of 12 bytes a parameter), and each module Megatron recomputes saves less, never more."""
    base = dict(tp=2, pp=1, ep=8, zero=1)
    plain = estimate(_job(64, **base), CATALOG)["memory"]
    narrow = Job.from_dict(_job(64, **base).to_dict() | {"optimizer": {"moment_dtype": "bf16"}}, CATALOG)
    assert estimate(narrow, CATALOG)["memory"]["optimizer_bytes"] == pytest.approx(plain["optimizer_bytes"] * 8 / 12)

    def activations(modules):
        data = _job(64, **base).to_dict()
        data["memory"] |= {"recompute": "selective", "recompute_modules": modules}
        return estimate(Job.from_dict(data, CATALOG), CATALOG)["memory"]["activations_bytes"]

    steps = [["core_attn"], ["core_attn", "layernorm"], ["core_attn", "layernorm", "moe_act"], ["core_attn", "moe"]]
    sizes = [activations(m) for m in steps]
    assert sizes[0] > sizes[1] > sizes[2] > 0 and sizes[3] < sizes[2]
    with pytest.raises(SpecError, match="allowed: core_attn, layernorm"):
        Job.from_dict(
            _job(64, **base).to_dict() | {"memory": {"recompute": "selective", "recompute_modules": ["mlpp"]}}, CATALOG
        ).resolve(CATALOG)
