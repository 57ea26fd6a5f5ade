"""Training FLOPs against the GPT-3 paper and the attention term's convention."""

import pytest

from toolkit.estimate import PF_DAY_FLOPS, count_params, training_flops

GPT3_FLOPS = 3.14e23  # GPT-3 paper, Table D.1
GPT3_PF_DAYS = 3640  # idem


def test_gpt3_175b_six_nd_matches_paper(catalog):
    model = catalog.preset("gpt3-175b").model
    flops = training_flops(model, count_params(model).total, 300e9)
    assert flops.flops_6nd == pytest.approx(GPT3_FLOPS, rel=0.01)
    assert flops.flops_6nd / PF_DAY_FLOPS == pytest.approx(GPT3_PF_DAYS, rel=0.01)


def test_causal_attention_term(catalog):
    model = catalog.preset("gpt3-175b").model
    flops = training_flops(model, count_params(model).total, 300e9)
    # 6·L·s·h per token: 6 · 96 · 2048 · 12288 · 300e9
    assert flops.attention_flops == pytest.approx(6 * 96 * 2048 * 12288 * 300e9, rel=1e-12)
    assert flops.total_flops == pytest.approx(flops.flops_6nd + flops.attention_flops)
    assert 0.01 < flops.attention_flops / flops.flops_6nd < 0.02  # 1.4 % for GPT-3's 2048 context
    assert "causal" in flops.convention


def test_encoder_counts_full_attention(catalog):
    bert = catalog.preset("bert-large").model
    decoder = bert.replace(encoder=False)
    n = count_params(bert).total
    assert training_flops(bert, n, 1e9).attention_flops == pytest.approx(
        2 * training_flops(decoder, n, 1e9).attention_flops
    )


def test_attention_grows_with_sequence(catalog):
    model = catalog.preset("llama2-7b").model
    n = count_params(model).total
    short, long = (training_flops(model.replace(seq_len=s), n, 1e12) for s in (4096, 32768))
    assert long.attention_flops == pytest.approx(8 * short.attention_flops)
    assert long.flops_6nd == short.flops_6nd
