"""The serving estimate against figures published outside the toolkit: KV-cache bytes per token from the papers that
introduced each attention, a paged engine's block count, and the physics a decode step cannot escape."""

from __future__ import annotations

import math

import pytest

from toolkit.estimate import estimate
from toolkit.estimate.kv_cache import cache_bytes, kv_bytes_per_token
from toolkit.specs import Job, SpecError
from toolkit.specs.hf_config import model_from_hf_config
from toolkit.specs.model import ModelSpec

from ..conftest import FIXTURES


def _serve(catalog, model="llama2-7b", gpus="1xA100-80GB", **serving) -> dict:
    count, name = gpus.split("x")
    job = {
        "model": {"preset": model},
        "cluster": {"accelerator": name, "count": int(count)},
        "workload": "inference",
        "serving": {"concurrency": 32, "input_tokens": 1024, "output_tokens": 256, **serving},
    }
    parallel = serving.pop("parallel", None)
    if parallel:
        job["parallel"] = parallel
    job["serving"] = {k: v for k, v in job["serving"].items() if k != "parallel"}
    return estimate(Job.from_dict(job, catalog), catalog)


def test_opt13b_keeps_800kb_a_token():
    """PagedAttention (Kwon et al. 2023, §3): 'for the 13B parameter OPT model, the KV cache of a single token demands
    800 KB of space, calculated as 2 (key and value vectors) × 5120 (hidden state size) × 40 (number of layers) × 2
    (bytes per FP16)'."""
    opt13b = ModelSpec(layers=40, hidden=5120, heads=40, vocab=50272, seq_len=2048)
    assert kv_bytes_per_token(opt13b, kv_bytes=2) == 2 * 5120 * 40 * 2 == 819_200


def test_grouped_and_multi_query_keep_their_kv_heads_only():
    """GQA (Ainslie et al. 2023): kv_heads groups of keys and values; MQA (Shazeer 2019): one. Llama-3-70B's 8 kv heads
    of 128 over 80 layers: 2 × 8 × 128 × 80 × 2 B = 327,680 B a token, an eighth of its 64 query heads' worth."""
    llama3_70b = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, seq_len=8192)
    mha = ModelSpec(layers=80, hidden=8192, heads=64, vocab=128256, seq_len=8192)
    mqa = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=1, vocab=128256, seq_len=8192)
    assert kv_bytes_per_token(llama3_70b, 2) == 327_680
    assert kv_bytes_per_token(mha, 2) == 8 * 327_680
    assert kv_bytes_per_token(mqa, 2) == 327_680 / 8
    # tp 8 keeps one kv head a rank; tp 16 still one (vLLM replicates a kv head it cannot split)
    assert kv_bytes_per_token(llama3_70b, 2, tp=8) == 327_680 / 8
    assert kv_bytes_per_token(llama3_70b, 2, tp=16) == 327_680 / 8


def test_latent_attention_keeps_the_latent_and_the_rotary_key():
    """DeepSeek-V2 (arXiv 2405.04434, Table 1): MLA caches (d_c + d_h^R)·l elements a token, d_c = 4·d_h = 512 and
    d_h^R = d_h/2 = 64: 576 per layer, on every tensor-parallel rank; V3's 61 layers at 16 bits: 70,272 B."""
    v3 = model_from_hf_config(FIXTURES / "hf" / "deepseek-v3")
    assert kv_bytes_per_token(v3, 2) == 576 * 61 * 2
    assert kv_bytes_per_token(v3, 2, tp=8) == 576 * 61 * 2


def test_sliding_windows_stop_growing():
    """Mistral 7B (arXiv 2310.06825 §2): a 4096-token window in every layer, so 'a fixed cache size of W': past 4096
    tokens a sequence's cache stops growing. gpt-oss keeps a 128-token window in half of its layers (its config's
    layer_types)."""
    mistral = model_from_hf_config(FIXTURES / "hf" / "mistral-7b")
    per_token = kv_bytes_per_token(mistral, 2)
    assert mistral.sliding_window == 4096
    assert cache_bytes(mistral, 32_000, 2) == cache_bytes(mistral, 4096, 2) == 4096 * per_token
    oss = model_from_hf_config(FIXTURES / "hf" / "gpt-oss-120b")
    assert oss.sliding_window == 128 and oss.sliding_layers == oss.layers // 2
    full_layers = oss.layers - oss.sliding_layers
    assert cache_bytes(oss, 8192, 2) == (full_layers * 8192 + oss.sliding_layers * 128) * per_layer_token(oss)


def per_layer_token(model) -> float:
    return 2 * model.kv_heads_ * model.head_dim_ * 2


def test_the_blocks_fill_what_the_engine_leaves(catalog):
    """vLLM's arithmetic (gpu_worker.determine_available_memory): memory_fraction of the device, less the weights,
    the step's activations and what lies outside torch, in blocks of block_size tokens; the largest concurrency at
    max_context is blocks × block_size / max_context (its 'Maximum concurrency' log line, floored)."""
    r = _serve(catalog)
    s, mem = r["serving"], r["memory"]
    block = s["kv_bytes_per_token"] * s["block_size"]
    left = mem["budget_bytes"] - mem["weights_bytes"] - mem["activation_bytes"] - mem["runtime_bytes"]
    assert s["kv_blocks"] == math.floor(left / block)
    assert s["max_concurrency"] == math.floor(s["kv_blocks"] * s["block_size"] / s["max_context"])
    # Llama-2-7B's 6.74 B weights at 16 bits are 13.5 GB; at int4 with group 128 about a quarter of the blocks'
    assert mem["weights_bytes"] == pytest.approx(6.74e9 * 2, rel=0.01)
    int4 = _serve(catalog, weights="int4")
    assert int4["memory"]["weights_bytes"] < 0.35 * mem["weights_bytes"]
    assert int4["serving"]["max_concurrency"] > s["max_concurrency"]


def test_concurrency_max_takes_the_largest_that_fits(catalog):
    r = _serve(catalog, concurrency="max")
    assert r["serving"]["concurrency"] == r["serving"]["max_concurrency"] > 32
    assert r["memory"]["fits"]
    over = _serve(catalog, concurrency=10_000)
    assert over["memory"]["fits"] is False and any("does not fit" in n for n in over["notes"])


def test_decode_cannot_beat_reading_the_weights(catalog):
    """One request decodes no faster than the device reads every weight once a token: Llama-2-7B on an A100-80GB
    (2,039 GB/s datasheet) takes at least 13.5 GB / 2.04 TB/s = 6.6 ms a token; int4 weights read 4x fewer bytes."""
    one = _serve(catalog, concurrency=1)["serving"]
    assert one["tpot_s"] > 13.48e9 / 2039e9
    assert one["tpot_s"] < 2 * 13.48e9 / 2039e9  # and memory-bound, not far above that floor
    int4 = _serve(catalog, concurrency=1, weights="int4")["serving"]
    assert int4["tpot_s"] < 0.5 * one["tpot_s"]


def test_throughput_grows_with_concurrency_and_latency_with_it(catalog):
    curve = _serve(catalog, concurrency="max")["serving"]["curve"]
    tput = [p["output_tokens_per_s"] for p in curve]
    tpot = [p["tpot_s"] for p in curve]
    assert tput == sorted(tput) and tpot == sorted(tpot)
    assert tput[-1] > 8 * tput[0]


def test_tensor_parallelism_splits_weights_and_cache(catalog):
    one = _serve(catalog, model="llama2-70b", gpus="2xA100-80GB", parallel={"tp": 2}, concurrency=8)
    four = _serve(catalog, model="llama2-70b", gpus="4xA100-80GB", parallel={"tp": 4}, concurrency=8)
    assert four["memory"]["weights_bytes"] == pytest.approx(one["memory"]["weights_bytes"] / 2, rel=0.02)
    assert four["serving"]["kv_bytes_per_token"] == one["serving"]["kv_bytes_per_token"] / 2
    assert four["serving"]["tpot_s"] < one["serving"]["tpot_s"]


def test_cost_per_million_tokens_is_the_device_hour_over_the_tokens(catalog, cli_json):
    r = cli_json(
        "estimate",
        "--workload",
        "inference",
        "--model",
        "llama2-7b",
        "--gpus",
        "1xA100-80GB",
        "--concurrency",
        "32",
        "--input-tokens",
        "1024",
        "--output-tokens",
        "256",
        "--offer",
        "p4de.24xlarge",
    )
    s, c = r["serving"], r["cost"]
    for key in ("kv_cache_bytes", "max_concurrency", "ttft_s", "tpot_s", "output_tokens_per_s"):
        assert s[key] > 0, key
    offer = catalog.offer("p4de.24xlarge")
    per_device_hour = offer.on_demand_per_hour / offer.count
    assert c["usd_per_million_output_tokens"] == pytest.approx(
        per_device_hour / (s["output_tokens_per_s"] * 3600) * 1e6
    )
    assert 0 < c["usd_per_million_input_tokens"] < c["usd_per_million_output_tokens"]


def test_serving_input_is_refused_in_one_line(cli):
    code, _out, err = cli(
        "estimate", "--workload", "inference", "--model", "llama2-7b", "--gpus", "1xA100-80GB", "--concurrency", "-3"
    )
    assert code == 2 and err.count("\n") == 1 and "--concurrency" in err
    code, _out, err = cli(
        "estimate", "--workload", "inference", "--model", "llama2-7b", "--gpus", "1xA100-80GB", "--weights", "int3"
    )
    assert code == 2 and "int4" in err
    code, _out, err = cli(
        "estimate", "--workload", "inference", "--model", "llama2-7b", "--gpus", "1xA100-80GB", "--max-context", "100"
    )
    assert code == 2 and "max_context" in err or "--max-context" in err
    with pytest.raises(SpecError, match="training layout"):
        Job.from_dict({"model": {"preset": "llama2-7b"}, "workload": "inference", "parallel": {"zero": 3}}).resolve()


def test_fp8_weights_run_at_the_fp8_rate_where_the_device_has_it(catalog):
    """W8A8 on an H100 (1,979 FP8 TFLOP/s, twice its bf16 peak): once the step is bound by FLOPs, fp8 weights beat
    int8 weight-only kernels, which read as few bytes but multiply at the 16-bit rate."""
    args = dict(model="llama2-70b", gpus="2xH100-SXM", parallel={"tp": 2}, concurrency=128)
    fp8, int8 = (_serve(catalog, weights=w, **args)["serving"]["tpot_s"] for w in ("fp8", "int8"))
    assert fp8 < 0.8 * int8


def test_a_sliding_window_bounds_what_decode_reads(catalog, tmp_path):
    """Mistral's 4,096-token window: at a 30,000-token context a step reads no more cache than at 4,096 plus the
    window's worth; the same model without the window reads all of it."""
    base = {"hf_config": str(FIXTURES / "hf" / "mistral-7b")}
    serving = {"concurrency": 8, "input_tokens": 30000, "output_tokens": 128}

    def tpot(model):
        job = {
            "model": model,
            "workload": "inference",
            "serving": serving,
            "cluster": {"accelerator": "H100-SXM", "count": 1},
        }
        # the steady decode step: under load, the 30,000-token prompts' prefill chunks dominate time per token
        return estimate(Job.from_dict(job, catalog), catalog)["serving"]["steady"]["tpot_s"]

    windowed, full = tpot(base), tpot({**base, "sliding_window": None})
    assert windowed < 0.6 * full


def test_moe_decode_reads_the_experts_it_touches_once_a_step(catalog):
    """Qwen3-30B-A3B (128 experts, top-8, 30.5 B parameters) decoding 16 requests on an H100: the step touches most
    experts, so it reads about the whole model once (61 GB in bf16 at 3.35 TB/s · 0.9: ~20 ms), not an expert
    kernel's fixed cost per expert."""
    tpot = _serve(catalog, model="qwen3-30b-a3b", gpus="1xH100-SXM", concurrency=16)["serving"]["tpot_s"]
    assert 0.015 < tpot < 0.04
