"""Request lengths spread as benchmarks draw them (serving.lengths): SGLang's `random` dataset's interval, ShareGPT's
prompt histogram (benchmarks/reference/request_lengths.md, source S4) and its mean output, and what spread does to
a closed loop: requests of one length finish together and queue their prefills together; spread ones do not."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.cli.main import main
from toolkit.estimate.serving_sim import draw_lengths

SGLANG_SHAREGPT_PROMPT_SHARES = {20: 0.2433, 100: 0.4796, 500: 0.8435}
"""SGLang PR 1853's server histogram of 1,003 ShareGPT prompts (Llama-3.2 tokenizer): share shorter than each."""


def test_uniform_draws_sglangs_interval_with_the_mean_kept():
    """sglang.bench_serving --dataset-name random --random-range-ratio r: lengths uniform on [r·X, X]."""
    x = draw_lengths(300, 200_000, "uniform", np.random.default_rng(1), range_ratio=0.5)
    assert x.mean() == pytest.approx(300, rel=0.01)
    assert x.min() >= 199 and x.max() <= 401  # X = 2·300 / 1.5 = 400, r·X = 200


def test_sharegpt_prompts_follow_the_published_histogram():
    x = draw_lengths(230, 200_000, "sharegpt_input", np.random.default_rng(2))
    for tokens, share in SGLANG_SHAREGPT_PROMPT_SHARES.items():
        assert (x < tokens).mean() == pytest.approx(share, abs=0.02)
    assert x.mean() == pytest.approx(229.7, rel=0.03)  # vLLM PR 18566: 229,711 prompt tokens over 1,000 prompts


def test_sharegpt_outputs_keep_the_benchmarks_mean():
    x = draw_lengths(198, 200_000, "sharegpt_output", np.random.default_rng(3))
    assert x.mean() == pytest.approx(198.1, rel=0.02)  # SGLang issue 2805: mean output 198.1 tokens
    assert 4 * 198 / 200 <= x.min() and np.median(x) < x.mean()  # long-tailed: the median below the mean


def _ttft(capsys, *lengths) -> float:
    import json

    main(["estimate", "--workload", "inference", "--model", "llama3-8b", "--gpus", "1xA100-80GB", "--concurrency",
          "64", "--input-tokens", "250", "--output-tokens", "250", "--requests", "600", *lengths, "--json"])  # fmt: skip
    return json.loads(capsys.readouterr().out)["serving"]["ttft_s"]


def test_a_closed_loop_of_spread_lengths_does_not_queue_its_prefills_in_waves(capsys):
    """LMDeploy's ShareGPT runs at 64 in flight read 92-159 ms to first token on an A100 where 64 fixed-length
    prompts queued at once take several times one prefill: spread outputs finish, and new prompts arrive, apart."""
    fixed = _ttft(capsys)
    spread = _ttft(capsys, "--dataset-name", "sharegpt")
    assert spread < 0.6 * fixed
