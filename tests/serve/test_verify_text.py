"""`generate --verify` in a 16-bit mode: a cached and an uncached greedy run may part (they round in a different order),
and the report says so, where they part, and how to check the cache itself, instead of a bare False."""

from toolkit.serve.compare import render_generate
from toolkit.serve.worker import _first_difference

RECORD = {
    "serving": {"concurrency": 2, "input_tokens": 16, "output_tokens": 4},
    "world": 1,
    "ttft_s": 0.01,
    "tpot_s": 0.002,
    "output_tokens_per_s": 900.0,
    "kv_cache_bytes": 2**20,
    "peak_bytes": 2**21,
    "instrument": "MemTracker",
}


def test_the_first_difference_is_where_any_request_parts():
    assert _first_difference([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 6, 9, 9]]) == 2
    assert _first_difference([[1, 2]], [[1, 2]]) is None


def test_a_bf16_difference_is_explained():
    text = render_generate(
        {**RECORD, "matches_plain_forward": False, "compute_dtype": "bf16", "first_difference": 2}, "r"
    )
    assert "expected in bf16" in text and "new token 2" in text and "--precision fp32 --verify" in text


def test_an_fp32_difference_is_not_explained_away():
    text = render_generate({**RECORD, "matches_plain_forward": False, "compute_dtype": "fp32"}, "r")
    assert "expected in" not in text
