"""`toolkit export --hf`: the fine-tune loop closed. A small Llama and its tokenizer made here (no network) are
fine-tuned on data prepared with that tokenizer and exported; transformers loads the folder and greedy-generates the
tokens `toolkit generate` generates from the run, `--init-from`'s loader reads the run's weights back bit for bit,
and `generate --prompt` prints what transformers decodes. A GPT-2 style run and the refusals beside it."""

from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from tests.hf_tiny import tiny_llama  # noqa: E402
from toolkit.cli import main  # noqa: E402
from toolkit.specs import Job  # noqa: E402

TRAIN = ["--seq", "32", "--micro-batch", "2", "--global-batch", "2", "--steps", "2", "--warmup", "1"]
TRAIN += ["--lr", "1e-3", "--precision", "fp32", "--num-workers", "0", "--no-progress"]


def toolkit(*argv: str) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter to start): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _tokenizer_and_llama(folder, texts):
    """The tiny Llama with weights wide enough that greedy decoding does not repeat one token."""
    return tiny_llama(folder, texts, seed=7, weight_std=0.2)[0]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Tokenizer and Llama -> data prepared with the tokenizer -> a 2-step fine-tune -> `export --hf RUN OUT`."""
    from toolkit.train.data import demo_sources

    base = tmp_path_factory.mktemp("loop")
    texts = [text for _name, text in demo_sources()[:30]]
    tok = _tokenizer_and_llama(base / "llama", texts[:20])
    (base / "notes.txt").write_text("\n\n".join(texts[20:]))
    code, _o, err = toolkit(
        "data", "prepare", base / "notes.txt", "--tokenizer", base / "llama", "--out", base / "data"
    )
    assert code == 0, err
    run, out = base / "run", base / "hf"
    llama = ["--hf-config", base / "llama", "--init-from", base / "llama", "--data", base / "data"]
    code, _o, err = toolkit("train", *llama, *TRAIN, "--out", run)
    assert code == 0, err
    code, text, err = toolkit("export", "--hf", run, out)
    assert code == 0, err
    return SimpleNamespace(base=base, tok=tok, run=run, out=out, printed=text)


def test_transformers_generates_the_tokens_toolkit_generate_does(loop):
    from toolkit.serve.worker import _prompts

    assert "model.safetensors, config.json, generation_config.json, tokenizer.json" in loop.printed
    gen = loop.base / "gen"
    code, _o, err = toolkit(
        "generate", "--config", loop.run / "job.yaml", "--init-from", loop.run, "--concurrency", "2",
        "--input-tokens", "12", "--output-tokens", "10", "--out", gen,
    )  # fmt: skip
    assert code == 0, err
    ours = json.loads((gen / "generate.json").read_text())["tokens"]
    model = transformers.AutoModelForCausalLM.from_pretrained(loop.out).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    model.generation_config.eos_token_id = None  # (toolkit generate makes a fixed number of tokens)
    prompts = _prompts(Job.from_yaml(gen / "job.yaml"), torch.device("cpu"))
    with torch.no_grad():
        theirs = model.generate(prompts, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert theirs[:, 12:].tolist() == ours
    assert len(set(ours[0])) > 3


def test_the_init_from_loader_reads_the_runs_weights_back(loop):
    """The names are `--init-from`'s, inverted: its loader gives back exactly the weights the run holds."""
    from toolkit.checkpoint.init_weights import hf_state_dict
    from toolkit.serve.run import run_weights
    from toolkit.specs.hf_config import model_from_hf_config

    job = Job.from_yaml(loop.run / "job.yaml")
    ours = run_weights(loop.run, job)
    back = hf_state_dict(loop.out)
    assert set(back) == set(ours)
    assert all(np.array_equal(back[name].numpy(), array) for name, array in ours.items())
    assert model_from_hf_config(loop.out, seq_len=32).replace(name=job.model.name) == job.model


def test_the_tokenizer_travels_and_generate_prompt_prints_what_transformers_decodes(loop):
    tokenizer = transformers.AutoTokenizer.from_pretrained(loop.out)
    text = "The import statement"
    ids = tokenizer(text)["input_ids"]
    assert ids == loop.tok.encode(text).ids
    code, printed, err = toolkit(
        "generate", "--config", loop.run / "job.yaml", "--init-from", loop.run, "--prompt", text,
        "--output-tokens", "12", "--json",
    )  # fmt: skip
    assert code == 0, err
    ours = json.loads(printed)
    model = transformers.AutoModelForCausalLM.from_pretrained(loop.out).eval()
    with torch.no_grad():  # (stops at the data's end-of-document id, as --prompt's text does)
        theirs = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    assert ours["prompt_tokens"] == ids and ours["tokens"][: len(theirs)] == theirs
    assert ours["text"] == loop.tok.decode(theirs) and ours["text"].strip()


def test_train_takes_the_vocabulary_from_the_prepared_data(loop, tmp_path):
    from toolkit.train.launch import prepare_run

    data = json.loads((loop.base / "data" / "index.json").read_text())
    model = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 32}
    job = Job.from_dict({"model": model, "training": {"data": str(loop.base / "data")}})
    assert prepare_run(job, tmp_path / "a", 1).model.vocab == data["vocab"]
    given = Job.from_dict({"model": {**model, "vocab": 1024}, "training": {"data": str(loop.base / "data")}})
    assert prepare_run(given, tmp_path / "b", 1).model.vocab == 1024


def test_a_gpt2_style_run_loads_as_gpt2_with_the_same_logits(tmp_path):
    from toolkit.checkpoint.init_weights import load_initial_weights
    from toolkit.program.model import GPT

    shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--no-tie-embeddings"]
    code, _o, err = toolkit("train", *shape, *TRAIN, "--out", tmp_path / "run")
    assert code == 0, err
    code, _o, err = toolkit("export", "--hf", tmp_path / "run", "--out", tmp_path / "hf")
    assert code == 0, err
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "GPT2LMHeadModel"
    ours = GPT(Job.from_yaml(tmp_path / "run" / "job.yaml").model).eval()
    load_initial_weights(ours, tmp_path / "run")
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)


def test_what_cannot_be_exported_is_refused_in_one_line(tmp_path):
    moe = Job.from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "experts": 4, "experts_per_token": 2}})
    neox = Job.from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "position": "rope"}})
    plain = Job.from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4}})
    for name, job in (("moe", moe), ("neox", neox), ("empty", plain)):
        (tmp_path / name).mkdir()
        job.to_yaml(tmp_path / name / "job.yaml")
    (tmp_path / "bare").mkdir()
    for argv, says in [
        (("export", "--hf", tmp_path / "nowhere", tmp_path / "o"), "no such folder"),
        (("export", "--hf", tmp_path / "bare", tmp_path / "o"), "holds no job.yaml"),
        (("export", "--hf", tmp_path / "empty", tmp_path / "o"), "holds no checkpoint yet"),
        (("export", "--hf", tmp_path / "moe", tmp_path / "o"), "model.experts = 4: export --hf writes dense"),
        (("export", "--hf", tmp_path / "neox", tmp_path / "o"), "export --hf writes Llama (rmsnorm + swiglu + rope)"),
        (("export", "--hf", tmp_path / "moe"), "give the folder to write"),
        (("export", "--model", "gpt2", "--out", tmp_path / "o"), "give --to accelerate|torchrun|slurm|deepspeed (a"),
        (("generate", "--layers", "2", "--hidden", "64", "--heads", "4", "--prompt", "hi"), "give --tokenizer"),
    ]:
        code, _o, err = toolkit(*argv)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err
    assert not (tmp_path / "o").exists()
