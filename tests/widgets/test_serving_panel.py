"""The serving panel: every control change re-estimates; a refused value says why and keeps the last view."""

from __future__ import annotations

from toolkit.estimate import estimate
from widgets.serving import ServingPanel


def test_the_panel_draws_the_estimate_and_follows_its_controls(catalog):
    panel = ServingPanel(preset="llama2-7b", accelerator="A100-80GB", catalog=catalog)
    first = panel.result
    assert first["serving"]["kv_bytes_per_token"] == 2 * 4096 * 32 * 2
    assert len(panel.memory_fig.data) == 5 and len(panel.curve_fig.data[0].x) == len(first["serving"]["curve"])
    offers = set(panel.cost_fig.data[0].x)
    assert {"p4de.24xlarge", "a2-ultragpu-1g"} <= offers  # every A100-80GB offer, none of another GPU's
    assert "p5.48xlarge" not in offers
    panel.controls["weights"].value = "int4"
    assert panel.result["serving"]["max_concurrency"] > first["serving"]["max_concurrency"]
    assert panel.result == estimate(panel.job(), catalog)  # the panel shows the library's figures, no maths of its own


def test_a_refused_value_says_why_and_keeps_the_last_view(catalog):
    panel = ServingPanel(catalog=catalog)
    before = panel.result
    panel.controls["input_tokens"].value = -5
    assert "input_tokens" in panel.error.value
    assert panel.result is before
    panel.controls["input_tokens"].value = 512
    assert panel.error.value == "" and panel.result["serving"]["input_tokens"] == 512


def test_a_model_too_large_for_its_gpus_is_said_so(catalog):
    panel = ServingPanel(preset="llama2-70b", accelerator="A100-80GB", catalog=catalog)
    assert "does not fit" in panel.summary.value and "--tp" in panel.summary.value
    panel.controls["tp"].value = 4
    assert "does not fit" not in panel.summary.value
