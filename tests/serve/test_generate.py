"""`toolkit generate` against independent references: greedy decoding with the cache equals the model's own forward
without one, token for token; the cache's bytes are the estimate's to the byte and the peak MemTracker measures is
within 3 % of it; the operations a decode step dispatches are those the CPU time model counts."""

from __future__ import annotations

import json

import pytest
import torch

from toolkit.estimate.serving_time import DECODE_OPS_FIXED, decode_ops_per_layer
from toolkit.program.generate import KVCache, greedy, next_logits, plain_greedy
from toolkit.program.model import GPT
from toolkit.specs import Job
from toolkit.specs.model import ModelSpec

LLAMA = dict(mlp="swiglu", norm="rmsnorm", position="rope", bias="none", kv_heads=2)
GPT2 = dict(mlp="gelu", norm="layernorm", position="learned", bias="all")
MOE = dict(LLAMA, experts=4, experts_per_token=2, expert_ffn=32)


def _model(style: dict, layers: int = 2) -> GPT:
    torch.manual_seed(0)
    model = GPT(ModelSpec(layers=layers, hidden=64, heads=4, vocab=97, seq_len=64, **style)).eval()
    with torch.no_grad():  # weights wide enough that the argmax changes from token to token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("style", [LLAMA, GPT2, MOE], ids=["llama-gqa", "gpt2", "moe"])
def test_greedy_with_the_cache_equals_the_forward_without_one(style):
    model = _model(style)
    prompts = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(1))
    cached = greedy(model, prompts, 24, KVCache.for_model(model, 3, 44), prefill_chunk=7)
    plain = plain_greedy(model, prompts, 24)
    assert cached.tolist() == plain.tolist()
    assert len(set(cached[0].tolist())) > 5  # (not one token repeated)


@pytest.mark.parametrize("style", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_a_decode_step_dispatches_the_operations_the_time_model_counts(style):
    from toolkit.calibrate.kernels import dispatched_ops

    counts = {}
    for layers in (1, 3):
        model = _model(style, layers)
        cache = KVCache.for_model(model, 2, 32)
        token = torch.zeros(2, 1, dtype=torch.long)
        with torch.inference_mode():
            next_logits(model, torch.zeros(2, 5, dtype=torch.long), cache)
            counts[layers] = dispatched_ops(lambda: next_logits(model, token, cache))  # noqa: B023
    job = Job.from_dict({"model": {"layers": 1, "hidden": 64, "heads": 4, "vocab": 97, "seq_len": 64, **style}})
    per_layer = decode_ops_per_layer(job)
    assert counts[3] - counts[1] == 2 * per_layer
    assert abs(counts[1] - per_layer - DECODE_OPS_FIXED) <= 1  # (learned positions add their table's lookup)


def _generate(cli, tmp_path, name: str, *flags: str) -> tuple[dict, dict]:
    out = tmp_path / name
    code, _o, err = cli(
        "generate",
        "--layers",
        "2",
        "--hidden",
        "128",
        "--heads",
        "4",
        "--vocab",
        "256",
        "--seq",
        "256",
        "--concurrency",
        "3",
        "--input-tokens",
        "40",
        "--output-tokens",
        "24",
        "--precision",
        "fp32",
        "--max-batched-tokens",
        "64",
        "--out",
        str(out),
        *flags,
    )
    assert code == 0, err
    record = json.loads((out / "generate.json").read_text())
    code, text, err = cli("compare", "--run", str(out), "--json")
    assert code == 0, err
    return record, {r["quantity"]: r for r in json.loads(text)["rows"]}


def test_generate_measures_the_cache_to_the_byte_and_the_peak_within_3_percent(cli, tmp_path):
    record, rows = _generate(
        cli, tmp_path, "one", "--kv-heads", "2", "--mlp", "swiglu", "--norm", "rmsnorm", "--verify"
    )
    assert record["matches_plain_forward"] is True
    assert rows["kv_cache_bytes"]["estimated"] == record["kv_cache_bytes"] == 3 * 64 * 2 * 2 * 2 * 32 * 4
    assert rows["weights_bytes"]["estimated"] == rows["weights_bytes"]["measured"]
    assert abs(rows["peak_bytes"]["error"]) < 0.03
    assert record["ttft_s"] > 0 and record["tpot_s"] > 0 and record["output_tokens_per_s"] > 0


def test_generate_on_two_tensor_parallel_ranks(cli, tmp_path):
    record, rows = _generate(cli, tmp_path, "tp2", "--nproc", "2", "--verify", "--output-tokens", "6")
    assert record["world"] == 2 and record["matches_plain_forward"] is True
    assert [r["kv_cache_bytes"] for r in record["ranks"]] == [rows["kv_cache_bytes"]["estimated"]] * 2
    # each rank's weights: the split matrices, the vocabulary's half, the norms, row biases and positions whole
    assert rows["weights_bytes"]["estimated"] == rows["weights_bytes"]["measured"]
    assert rows["peak_bytes"]["error"] < 0  # (the collectives' buffers are not modelled: see compare's note)


def test_hugging_face_weights_generate_what_transformers_generates(cli, tmp_path):
    """`--init-from` a Hugging Face folder: greedy tokens with our cache equal transformers' own greedy generate."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # weights wide enough that greedy decoding does not repeat one token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "llama")
    out = tmp_path / "gen"
    code, _o, err = cli(
        "generate",
        "--hf-config",
        str(tmp_path / "llama"),
        "--init-from",
        str(tmp_path / "llama"),
        "--seq",
        "128",
        "--precision",
        "fp32",
        "--concurrency",
        "2",
        "--input-tokens",
        "16",
        "--output-tokens",
        "12",
        "--out",
        str(out),
    )
    assert code == 0, err
    ours = json.loads((out / "generate.json").read_text())["tokens"]
    from toolkit.serve.worker import _prompts

    job = Job.from_yaml(out / "job.yaml")
    prompts = _prompts(job, torch.device("cpu"))
    with torch.no_grad():
        theirs = model.generate(prompts, max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0)
    assert theirs[:, 16:].tolist() == ours
    assert len(set(ours[0])) > 3


def test_what_generate_cannot_run_is_refused_in_one_line(cli, tmp_path):
    """toolkit.capability's generate rules, as the command says them: another KV dtype, a context past the
    learned positions, ranks that do not divide the kv heads."""
    base = ["generate", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "64"]
    for extra, says in [
        (("--kv-dtype", "fp8"), "keeps weights and cache in the compute dtype"),
        (("--input-tokens", "60", "--output-tokens", "16", "--concurrency", "1"), "learned positions"),
        (
            ("--kv-heads", "2", "--nproc", "4", "--concurrency", "1", "--input-tokens", "8", "--output-tokens", "8"),
            "must divide the model's 2 kv heads",
        ),
    ]:
        code, _out, err = cli(*base, "--out", str(tmp_path / "x"), *extra)
        assert code != 0 and says in err and len(err.strip().splitlines()) == 1, err
