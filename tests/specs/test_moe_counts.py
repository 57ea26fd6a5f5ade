"""Mixture-of-Experts models read from their published config.json, counted against the official total and active
parameter counts (sources: tests/fixtures/hf/MOE_SOURCES.md). Each figure is held to the digits its source gives:
within half a unit of the last one, except two that read as truncated rather than rounded (Qwen3-30B-A3B's 3.3B
active counts 3.353B; DeepSeek-V2-Lite's 2.4B counts 2.451B), held within one unit."""

from pathlib import Path

import pytest

from toolkit.specs import Job, SpecError, load_catalog
from toolkit.specs.hf_config import model_from_hf_config
from toolkit.specs.params import count_params

HF = Path(__file__).parents[1] / "fixtures" / "hf"

# folder: (total, its unit, active, its unit, what the source's "active" leaves out)
OFFICIAL = {
    "mixtral-8x7b": (46.7e9, 0.05e9, 12.9e9, 0.05e9, ()),
    "mixtral-8x22b": (141e9, 0.5e9, 39e9, 0.5e9, ()),
    "deepseek-v2-lite": (15.7e9, 0.05e9, 2.4e9, 0.1e9, ("embedding",)),
    "deepseek-v3": (671e9, 0.5e9, 37e9, 0.5e9, ("embedding",)),
    "qwen3-30b-a3b": (30.5e9, 0.05e9, 3.3e9, 0.1e9, ()),
    "olmoe-1b-7b": (6.9e9, 0.05e9, 1.3e9, 0.05e9, ()),
    "gpt-oss-20b": (20.91e9, 0.005e9, 3.61e9, 0.005e9, ("embedding",)),
    "gpt-oss-120b": (116.83e9, 0.005e9, 5.13e9, 0.005e9, ("embedding",)),
}


@pytest.mark.parametrize("folder", OFFICIAL)
def test_total_and_active_parameters_are_the_official_ones(folder):
    total, total_unit, active, active_unit, left_out = OFFICIAL[folder]
    model = model_from_hf_config(HF / folder)
    model.validate()
    counts = count_params(model)
    assert abs(counts.total - total) <= total_unit, counts.total
    used = counts.active - (counts.embedding if "embedding" in left_out else 0)
    assert abs(used - active) <= active_unit, used


def test_qwen3_non_embedding_count_is_the_cards():
    """Qwen's "Non-Embedding: 29.9B" leaves out the embedding and the untied output head."""
    counts = count_params(model_from_hf_config(HF / "qwen3-30b-a3b"))
    assert abs(counts.total - counts.embedding - counts.head - 29.9e9) <= 0.05e9


def test_an_estimate_of_one_reports_its_official_counts(catalog):
    """`toolkit estimate --hf-config mixtral --ep 8 --json`'s model part: the official total and active counts."""
    from toolkit.estimate import estimate

    job = Job.from_dict(
        {
            "model": {"hf_config": str(HF / "mixtral-8x7b")},
            "cluster": {"accelerator": "H100-SXM", "count": 64},
            "parallel": {"ep": 8},
            "tokens": 1e12,
        },
        catalog,
    )
    out = estimate(job, catalog)
    total, total_unit, active, active_unit, _ = OFFICIAL["mixtral-8x7b"]
    assert abs(out["model"]["params"] - total) <= total_unit
    assert abs(out["model"]["active_params"] - active) <= active_unit
    assert out["memory"]["peak_bytes"] > 0 and out["time"]["step_s"] > 0 and out["time"]["breakdown"]["ep_comm_s"] > 0


@pytest.mark.parametrize(
    ("parallel", "says"),
    [({"ep": 3}, "must divide model.experts = 8"), ({"ep": 16}, "allowed: 1, 2, 4, 8")],
)
def test_an_expert_parallel_degree_that_cannot_split_is_refused_in_one_line(catalog, parallel, says):
    job = Job.from_dict(
        {
            "model": {"hf_config": str(HF / "mixtral-8x7b")},
            "cluster": {"accelerator": "H100-SXM", "count": 16},
            "parallel": parallel,
        },
        catalog,
    )
    with pytest.raises(SpecError, match=says):
        job.resolve(catalog)


def test_a_dense_model_takes_no_expert_parallelism(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-7b"}, "parallel": {"ep": 2}}, catalog)
    with pytest.raises(SpecError, match="this model has none"):
        job.resolve(catalog)


def test_a_dense_model_is_all_active():
    counts = count_params(model_from_hf_config(HF / "llama2-7b"))
    assert counts.active == counts.total and counts.experts_per_layer == 0


def test_the_presets_are_their_configs(catalog):
    """Each MoE preset is the architecture of its published config (the same counts), with its published figures."""
    for preset, folder in {
        "mixtral-8x7b": "mixtral-8x7b",
        "mixtral-8x22b": "mixtral-8x22b",
        "deepseek-v2-lite": "deepseek-v2-lite",
        "deepseek-v3": "deepseek-v3",
        "qwen3-30b-a3b": "qwen3-30b-a3b",
        "olmoe-1b-7b": "olmoe-1b-7b",
    }.items():
        row = catalog.preset(preset)
        mine, theirs = count_params(row.model), count_params(model_from_hf_config(HF / folder))
        assert (mine.total, mine.active) == (theirs.total, theirs.active), preset
        assert row.params_published == OFFICIAL[folder][0] and row.active_params_published == OFFICIAL[folder][2]


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"experts": 8, "experts_per_token": 9}, "model.experts_per_token"),
        ({"experts": 8, "experts_per_token": 2, "dense_layers": 4}, "model.dense_layers"),
        ({"experts_per_token": 2}, "model.experts"),
        ({"attention_kind": "mla"}, "model.kv_lora_rank"),
        ({"experts": -1}, "model.experts"),
    ],
)
def test_impossible_expert_layouts_are_refused_in_one_line(bad, field):
    with pytest.raises(SpecError) as err:
        Job.from_dict({"model": {"layers": 4, "hidden": 64, "heads": 4, **bad}}, load_catalog()).resolve()
    assert err.value.field == field
