"""Own data, own tokenizer, own model: a tokenizer and a small Hugging Face model built here (no network), documents
prepared with that tokenizer, and a fine-tune from the model's weights whose first loss is the model's own."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from tests.hf_tiny import tiny_llama  # noqa: E402
from toolkit.train.data import StepSampler, TokenShards, demo_sources  # noqa: E402


def _tokenizer_and_model(folder, texts):
    return tiny_llama(folder, texts, seed=5)


def test_own_tokenizer_data_and_model_fine_tune_from_its_weights(cli, tmp_path):
    texts = [text for _name, text in demo_sources()[:60]]
    tok, model = _tokenizer_and_model(tmp_path / "mine", texts[:40])
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[40:]))
    notes = tmp_path / "notes.txt"
    notes.write_text(texts[0])

    data = tmp_path / "data"
    code, out, err = cli(
        "data",
        "prepare",
        str(docs),
        str(notes),
        "--tokenizer",
        str(tmp_path / "mine"),
        "--field",
        "body",
        "--mix",
        "3,1",
        "--out",
        str(data),
    )
    assert code == 0, err
    index = json.loads((data / "index.json").read_text())
    eos = tok.token_to_id("</s>")
    assert index["vocab"] == tok.get_vocab_size() and index["eos_id"] == eos
    train_ids = np.fromfile(data / "train_00000.bin", dtype=np.uint16)
    first = tok.encode(texts[40]).ids
    assert train_ids[: len(first) + 1].tolist() == first + [eos]  # packed, the boundary after the document
    sources = [sum(len(tok.encode(t).ids) + 1 for t in texts[40:]), len(tok.encode(texts[0]).ids) + 1]
    assert len(train_ids) == pytest.approx(0.95 * sum(sources), rel=0.01)  # mixed 3:1, the total kept

    run = tmp_path / "run"
    code, out, err = cli(
        "train",
        "--hf-config",
        str(tmp_path / "mine"),
        "--init-from",
        str(tmp_path / "mine"),
        "--data",
        str(data),
        "--seq",
        "32",
        "--micro-batch",
        "2",
        "--global-batch",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--lr",
        "1e-3",
        "--precision",
        "fp32",
        "--num-workers",
        "0",
        "--no-progress",
        "--out",
        str(run),
    )
    assert code == 0, err
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    shards = TokenShards(data, "train", 32)
    windows = next(iter(StepSampler(len(shards), 2, 2, 0, 1, 1234, 0, 1)))
    batch = torch.stack([shards[i] for i in windows])
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
    own = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()
    assert losses[0] == pytest.approx(own, rel=1e-4)  # the fine-tune starts where the model is
    assert losses[-1] < losses[0]


def test_a_vocabulary_far_larger_than_the_data_is_warned_about(cli, tmp_path):
    code, _out, err = cli(
        "train",
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--vocab",
        "4096",
        "--seq",
        "32",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--num-workers",
        "0",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    )
    assert code == 0 and "never see a token" in err


def test_the_starting_weights_tokenizer_prepares_the_demo_corpus(cli, tmp_path):
    """No --data: the demo corpus is tokenized with the --init-from folder's tokenizer, not as bytes."""
    texts = [text for _name, text in demo_sources()[:40]]
    tok, _model = _tokenizer_and_model(tmp_path / "mine", texts)
    run = tmp_path / "run"
    code, _out, err = cli(
        "train",
        "--hf-config",
        str(tmp_path / "mine"),
        "--init-from",
        str(tmp_path / "mine"),
        "--seq",
        "32",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--precision",
        "fp32",
        "--num-workers",
        "0",
        "--no-progress",
        "--out",
        str(run),
    )
    assert code == 0, err
    assert "never see a token" not in err
    (index,) = (run / "cache").glob("demo-corpus-*/index.json")
    assert json.loads(index.read_text())["vocab"] == tok.get_vocab_size()
