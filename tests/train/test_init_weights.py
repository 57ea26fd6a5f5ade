"""Starting from Hugging Face weights on disk: the runner's GPT computes what transformers computes."""

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the `test` extra: CI has it

from toolkit.checkpoint.init_weights import load_initial_weights  # noqa: E402
from toolkit.program.model import GPT  # noqa: E402
from toolkit.specs import Job, SpecError  # noqa: E402


def _llama(tmp_path, **extra):
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **extra,
    )
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "llama")
    return model, tmp_path / "llama"


def _gpt2(tmp_path):
    config = transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(4)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path / "gpt2")
    return model, tmp_path / "gpt2"


@pytest.mark.parametrize("make", [_llama, _gpt2])
def test_loaded_model_gives_the_same_logits_as_transformers(tmp_path, make):
    reference, folder = make(tmp_path)
    job = Job.from_dict({"model": {"hf_config": str(folder), "seq_len": 32}})
    ours = GPT(job.model).eval()
    load_initial_weights(ours, folder)
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits
        got = ours(tokens)
    assert torch.allclose(got, expected, atol=2e-5, rtol=1e-4), (got - expected).abs().max()


def test_lora_fine_tune_from_a_hugging_face_folder(train, tmp_path):
    _reference, folder = _gpt2(tmp_path)
    records, state = train(
        model={"hf_config": str(folder), "seq_len": 32, "dropout": 0.0, "vocab": 300},
        finetune={"method": "lora", "rank": 4, "targets": ["q", "v"]},
        training={"steps": 3, "init_from": str(folder)},
    )
    assert records[-1]["loss"] < records[0]["loss"]
    from safetensors.torch import load_file

    hf = load_file(str(folder / "model.safetensors"))
    assert torch.equal(state["model"]["blocks.0.mlp.up.weight"], hf["transformer.h.0.mlp.c_fc.weight"].t())


def test_fine_tune_from_our_own_run(train, tmp_path):
    _, pretrained = train("pre", training={"steps": 3})
    records, state = train(
        "post",
        finetune={"method": "lora", "rank": 4, "targets": ["q", "v"]},
        training={"steps": 2, "init_from": str(tmp_path / "pre")},
    )
    assert torch.equal(state["model"]["blocks.1.mlp.down.weight"], pretrained["model"]["blocks.1.mlp.down.weight"])
    assert torch.equal(state["model"]["blocks.1.attn.q.base.weight"], pretrained["model"]["blocks.1.attn.q.weight"])


def test_weights_that_do_not_fit_are_named(tmp_path):
    _reference, folder = _llama(tmp_path)
    wrong = GPT(Job.from_dict({"model": {"hf_config": str(folder), "hidden": 128, "seq_len": 32}}).model)
    with pytest.raises(
        SpecError, match=r"does not fit the job's model \(shape: tok.weight \(300, 64\) vs \(300, 128\)"
    ):
        load_initial_weights(wrong, folder)
    with pytest.raises(SpecError, match="neither config.json nor a valid checkpoint"):
        load_initial_weights(wrong, tmp_path)


def test_fine_tune_from_a_run_on_two_ranks(tmp_path, corpus):
    """A 2-rank FSDP2 run keeps its weights as DCP shards (no .pt holds them). `--init-from` reads them whole in
    one process: the same tensors torch's own converter (dcp_to_torch_save) writes out, and the fine-tune starts
    from them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tests.train.conftest import tiny_job
    from toolkit.checkpoint import latest_checkpoint
    from toolkit.runs.folder import read_metrics
    from toolkit.train.launch import launch, prepare_run

    pre = tmp_path / "pre"
    job = prepare_run(
        tiny_job(parallel={"zero": 3}, training={"steps": 3, "data": str(corpus), "checkpoint_every": 3}), pre, 2
    )
    assert launch(job, pre, nproc=2, progress=False) == 0
    record, _path, _ = latest_checkpoint(pre / "checkpoints")
    assert record.get("model") is None and record["dcp"]
    converted = tmp_path / "whole.pt"
    dcp_to_torch_save(pre / "checkpoints" / record["dcp"]["dir"], converted)
    whole = torch.load(converted, weights_only=True)
    model = GPT(job.model)
    load_initial_weights(model, pre)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, whole["model"][name] if "model" in whole else whole[f"model/{name}"]), name
    post = tmp_path / "post"
    tuned = prepare_run(tiny_job(training={"steps": 2, "data": str(corpus), "init_from": str(pre)}), post, 1)
    assert launch(tuned, post, nproc=1, progress=False) == 0
    assert read_metrics(post / "metrics.jsonl")[0]["loss"] < read_metrics(pre / "metrics.jsonl")[0]["loss"]
