"""The Job: YAML round trip, defaults chosen by resolve(), and models from HF config.json files."""

from pathlib import Path

import pytest

from toolkit.estimate import count_params
from toolkit.specs import Job, ModelSpec, model_from_hf_config

HF = Path(__file__).parents[1] / "fixtures" / "hf"


def test_yaml_round_trip_is_exact(tmp_path, catalog):
    job = Job.from_dict(
        {
            "model": {"preset": "llama2-70b", "seq_len": 8192},
            "batch": {"micro_batch": 2, "global_batch": 512},
            "precision": {"mode": "mixed-bf16", "grad_dtype": "fp32"},
            "optimizer": {"name": "adamw"},
            "parallel": {"tp": 8, "pp": 4, "vpp": 2, "sp": True, "zero": 1},
            "memory": {"recompute": "selective", "act_compress": "int8"},
            "cluster": {"accelerator": "h100", "count": 64},
            "tokens": 2e12,
            "mfu": 0.4,
            "cost": {"offer": "p5.48xlarge", "spot": True},
        },
        catalog,
    )
    path = tmp_path / "job.yaml"
    job.to_yaml(path)
    again = Job.from_yaml(path, catalog)
    assert again == job
    resolved, _ = job.resolve(catalog)
    assert Job.from_yaml(_dump(resolved, tmp_path), catalog) == resolved
    assert resolved.cluster.accelerator == "H100-SXM"  # alias resolved to the catalog name
    assert resolved.parallel.dp == 2 and resolved.grad_accum == 128


def _dump(job, tmp_path):
    path = tmp_path / "resolved.yaml"
    job.to_yaml(path)
    return path


def test_preset_override_changes_only_what_is_named(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-7b", "seq_len": 8192}}, catalog)
    assert job.model.seq_len == 8192
    assert job.model.replace(seq_len=4096) == catalog.preset("llama2-7b").model.replace(name="llama2-7b")


def test_defaults_and_notes(catalog):
    job, notes = Job.from_dict(
        {
            "model": {"preset": "gpt3-175b"},
            "parallel": {"tp": 8, "pp": 8},
            "cluster": {"accelerator": "A100-80GB", "count": 1024},
        },
        catalog,
    ).resolve(catalog)
    assert job.parallel.dp == 16
    # published 3.2M tokens = 1563 sequences of 2048, rounded up to a multiple of micro-batch × dp = 16
    assert job.batch.global_batch == 1568 and job.grad_accum == 98
    assert job.tokens == 300e9
    assert job.precision.mode == "amp-bf16"
    assert any("1563" in n for n in notes) and any("tokens" in n for n in notes)


def test_interleaved_default_batch_is_whole_rounds(catalog):
    """With vpp > 1 the published batch is rounded up to whole rounds of pp micro-batches, which torch's interleaved
    schedule needs (1563 sequences on dp 16 would be 98 micro-batches: 98 % (98 // 8) != 0, refused)."""
    job, _ = Job.from_dict(
        {
            "model": {"preset": "gpt3-175b"},
            "parallel": {"tp": 8, "pp": 8, "vpp": 2},
            "cluster": {"accelerator": "A100-80GB", "count": 1024},
        },
        catalog,
    ).resolve(catalog)
    assert job.batch.global_batch == 1664 and job.grad_accum == 104  # 16 × 8 × 13


def test_fp16_default_where_no_bf16(catalog):
    job, notes = Job.from_dict(
        {"model": {"preset": "gpt2"}, "cluster": {"accelerator": "V100-32GB", "count": 8}}, catalog
    ).resolve(catalog)
    assert job.precision.mode == "amp-fp16" and any("no bf16" in n for n in notes)


def test_offer_supplies_accelerator_and_count(catalog):
    job, _ = Job.from_dict({"model": {"preset": "gpt2"}, "cost": {"offer": "P4DE.24XLARGE"}}, catalog).resolve(catalog)
    assert (job.cluster.accelerator, job.cluster.count, job.parallel.dp) == ("A100-80GB", 8, 8)


def test_numbers_in_yaml_strings_are_parsed(tmp_path, catalog):
    path = tmp_path / "job.yaml"
    path.write_text("model: {preset: gpt2}\ntokens: 300e9\nmfu: '0.4'\ncluster: {count: 8, accelerator: a100-80gb}\n")
    job = Job.from_yaml(path, catalog)
    assert job.tokens == 300e9 and job.mfu == 0.4


@pytest.mark.parametrize(
    "folder, exact",
    [
        ("llama2-7b", 6_738_415_616),
        ("mistral-7b", 7_241_732_096),
        ("qwen2-0.5b", 494_032_768),
        ("gpt2", 124_439_808),
        ("pythia-160m", 162_322_944),
    ],
)
def test_hf_config_gives_exact_counts(folder, exact):
    """Counts published for these checkpoints (model cards / num_parameters())."""
    assert count_params(model_from_hf_config(HF / folder)).total == exact


def test_hf_config_fields():
    qwen = model_from_hf_config(HF / "qwen2-0.5b" / "config.json", seq_len=4096)
    assert (qwen.kv_heads, qwen.bias, qwen.tie_embeddings, qwen.seq_len) == (2, "qkv", True, 4096)
    gpt2 = model_from_hf_config(HF / "gpt2")
    assert (gpt2.max_positions, gpt2.dropout, gpt2.mlp) == (1024, 0.1, "gelu")
    neox = model_from_hf_config(HF / "pythia-160m")
    assert (neox.position, neox.tie_embeddings, neox.vocab) == ("rope", False, 50304)


def test_hf_config_in_job(catalog):
    job = Job.from_dict({"model": {"hf_config": str(HF / "mistral-7b"), "seq_len": 4096}}, catalog)
    assert job.model.seq_len == 4096 and job.model.kv_heads == 8


def test_size_only_model_resolves(catalog):
    job, _ = Job.from_dict(
        {"model": {"params": "7e9"}, "cluster": {"accelerator": "A100-80GB", "count": 8}}, catalog
    ).resolve(catalog)
    assert job.model == ModelSpec(params=7_000_000_000)
