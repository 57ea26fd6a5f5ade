"""The pipeline panel redraws the simulator's schedule on every control change and never raises on a bad one."""

import pytest

from toolkit.estimate.pipeline import simulate
from widgets.pipeline import PipelinePanel


def test_more_microbatches_shrink_the_bubble_as_the_closed_form_says():
    panel = PipelinePanel(stages=4, microbatches=4)
    before = panel.timeline.bubble_fraction
    panel.controls["microbatches"].value = 16
    after = panel.timeline.bubble_fraction
    assert after < before
    # 1F1B, equal stages: bubble = (p - 1) / (m + p - 1) (Narayanan et al. 2021)
    assert after == pytest.approx(3 / (16 + 3), rel=1e-9) and before == pytest.approx(3 / 7, rel=1e-9)
    assert "16 micro-batches" in panel.figure.layout.title.text
    assert len(panel.figure.data) >= 2  # forwards and backwards drawn


def test_interleaving_is_the_simulators_and_holds_more_chunks():
    panel = PipelinePanel(stages=4, microbatches=8)
    panel.controls["schedule"].value = "interleaved"
    panel.controls["vpp"].value = 2
    expected = simulate("interleaved", 4, 8, 2)
    assert panel.timeline.step_s == expected.step_s and panel.timeline.peak_in_flight == expected.peak_in_flight
    assert "rank 0: " + str(expected.peak_in_flight[0]) in panel.summary.value


def test_a_combination_the_schedule_refuses_is_said_and_the_chart_marked_stale():
    panel = PipelinePanel(stages=4, microbatches=8)
    panel.controls["vpp"].value = 2  # 1F1B holds one stage per rank
    assert "needs the interleaved schedule" in panel.error.value
    assert panel.figure.layout.title.text.startswith("stale:")
    panel.controls["vpp"].value = 1
    assert panel.error.value == "" and not panel.figure.layout.title.text.startswith("stale:")
