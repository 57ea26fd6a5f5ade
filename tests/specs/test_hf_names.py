"""One name table read both ways: every tensor name of Hugging Face's Llama and GPT-2 maps to the runner's and back
to itself (so `--init-from` and `export --hf` cannot drift apart), including the MLP biases a Llama-shaped model
with `bias: all` carries; GPT-2 names without their `transformer.` prefix are read too."""

from __future__ import annotations

import pytest

from toolkit.specs.hf_names import hf_to_ours, ours_to_hf

LLAMA = [
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.11.self_attn.k_proj.weight", "model.layers.0.self_attn.o_proj.bias",
    "model.layers.3.mlp.gate_proj.weight", "model.layers.3.mlp.down_proj.bias",
    "model.layers.7.input_layernorm.weight", "model.layers.7.post_attention_layernorm.weight",
]  # fmt: skip
GPT2 = [
    "transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.bias", "lm_head.weight",
    "transformer.h.5.ln_1.weight", "transformer.h.5.ln_2.bias", "transformer.h.0.attn.c_proj.weight",
    "transformer.h.2.mlp.c_fc.bias", "transformer.h.2.mlp.c_proj.weight",
]  # fmt: skip


@pytest.mark.parametrize(("family", "names"), [("llama", LLAMA), ("gpt2", GPT2)])
def test_every_name_goes_to_the_runner_and_back(family, names):
    for name in names:
        ours = hf_to_ours(family, name)
        assert ours is not None and ours_to_hf(family, ours) == name


def test_gpt2_names_without_their_prefix_and_unknown_names():
    assert hf_to_ours("gpt2", "h.4.mlp.c_fc.weight") == "blocks.4.mlp.up.weight"
    assert hf_to_ours("llama", "model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert hf_to_ours("qwen2", "model.layers.1.self_attn.q_proj.bias") == "blocks.1.attn.q.bias"
