"""The engines as their code runs them (toolkit/data/engines.yaml): every default sourced; SGLang runs a prefill
batch on its own (enable_mixed_chunk off) where vLLM mixes prompt chunks into the decode step, so under load SGLang
reaches the first token sooner and stalls the decodes more, and alone the two agree."""

from __future__ import annotations

import json

import pytest

from toolkit.cli.main import main
from toolkit.specs.engines import ENGINES, _table, engine_defaults

SOURCED = ("max_num_seqs", "max_num_batched_tokens", "block_size", "memory_fraction", "host_overlapped")


@pytest.mark.parametrize("name", ENGINES)
def test_every_default_has_its_source(name):
    row = _table()[name]
    for key in SOURCED:
        assert key in row and row["sources"].get(key), f"{name}.{key} has no source"
    assert engine_defaults(name).max_num_seqs == row["max_num_seqs"]


def _serving(capsys, engine: str, rate: str) -> dict:
    capsys.readouterr()
    assert main(["estimate", "--workload", "inference", "--model", "llama3-70b", "--gpus", "4xH100-SXM", "--tp", "4",
                 "--weights", "fp8", "--input-tokens", "467", "--output-tokens", "256", "--requests", "400",
                 "--rate", rate, "--engine", engine, "--json"]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)["serving"]


def test_under_load_sglang_prefills_first_and_vllm_mixes(capsys):
    vllm, sglang = _serving(capsys, "vllm", "16"), _serving(capsys, "sglang", "16")
    assert sglang["ttft_s"] < vllm["ttft_s"] and sglang["tpot_s"] > vllm["tpot_s"]


def test_alone_the_engines_agree_on_the_first_token(capsys):
    vllm, sglang = _serving(capsys, "vllm", "0.05"), _serving(capsys, "sglang", "0.05")
    assert sglang["ttft_s_p50"] == pytest.approx(vllm["ttft_s_p50"], rel=0.05)


@pytest.mark.parametrize(
    ("engine", "device", "memory_gib", "seqs", "tokens"),
    [
        ("vllm", "H100-SXM", 80, 1024, 8192),  # vLLM's OpenAI server on a >= 70 GiB part that is not an A100
        ("vllm", "A100-80GB", 80, 256, 2048),  # an A100 takes the smaller defaults whatever its memory
        ("vllm", "L4", 24, 256, 2048),
        ("sglang", "L4", 24, 2048, 2048),  # SGLang's prefill chunk by GPU memory
        ("sglang", "A100-40GB", 40, 2048, 4096),
        ("sglang", "B200", 180, 2048, 16384),
    ],
)
def test_defaults_follow_the_device_as_the_engines_pick_them(engine, device, memory_gib, seqs, tokens):
    e = engine_defaults(engine, device, memory_gib)
    assert (e.max_num_seqs, e.max_batched_tokens) == (seqs, tokens)
