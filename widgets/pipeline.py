"""The pipeline panel: stages, micro-batches, schedule and virtual stages in; the schedule simulator's Gantt chart,
bubble fraction and what each stage holds out.

    from widgets.pipeline import PipelinePanel
    PipelinePanel(stages=4, microbatches=8)

Every control change runs `toolkit.estimate.pipeline.simulate` (torch's schedules' own orders, forward 1 unit and
backward 2 per micro-batch and stage, as in notebook 07) and redraws; a combination the schedule refuses (vpp
without interleaving, micro-batches the interleaved rounds cannot group) is said in one line and the old chart is
marked stale, never raised.
"""

from __future__ import annotations

import html

import ipywidgets as W

from toolkit.estimate.pipeline import SCHEDULES, simulate
from toolkit.views.figures import pipeline_figure
from widgets.fallback import PanelText
from widgets.live_figure import LiveFigure

__all__ = ["PipelinePanel"]


class PipelinePanel(PanelText, W.VBox):
    panel_name = "the pipeline schedule panel"

    def __init__(self, stages: int = 4, microbatches: int = 8, schedule: str = "1f1b", vpp: int = 1):
        style = {"description_width": "110px"}
        self.controls = {
            "stages": W.IntSlider(value=stages, min=1, max=16, description="stages (pp)", style=style),
            "microbatches": W.IntSlider(value=microbatches, min=1, max=64, description="micro-batches", style=style),
            "schedule": W.Dropdown(options=list(SCHEDULES), value=schedule, description="schedule", style=style),
            "vpp": W.IntSlider(value=vpp, min=1, max=4, description="virtual stages", style=style),
        }
        self.timeline = None
        self.error = W.HTML()
        self.summary = W.HTML()
        self.figure = LiveFigure()
        for control in self.controls.values():
            control.observe(lambda _change: self.refresh(), names="value")
        super().__init__(
            [
                W.HBox(list(self.controls.values())[:2]),
                W.HBox(list(self.controls.values())[2:]),
                self.error,
                self.figure,
                self.summary,
            ]
        )
        self.refresh()

    def refresh(self) -> None:
        v = {name: control.value for name, control in self.controls.items()}
        try:
            timeline = simulate(v["schedule"], v["stages"], v["microbatches"], v["vpp"])
        except ValueError as err:
            self.error.value = f"<b style='color:#b00'>{html.escape(str(err))}</b>"
            self.figure.layout.title = f"stale: {self.figure.layout.title.text or ''}"
            return
        self.timeline, self.error.value = timeline, ""
        new = pipeline_figure(timeline.to_dict())
        with self.figure.batch_update():
            self.figure.data = []
            self.figure.add_traces(new.data)
            self.figure.layout = new.layout
        self.summary.value = _summary_html(timeline)


def _summary_html(tl) -> str:
    p, m = tl.stages, tl.microbatches
    closed = (p - 1) / (m + p - 1)
    held = ", ".join(f"rank {r}: {n}" for r, n in enumerate(tl.peak_in_flight))
    return (
        f"<b>step</b> {tl.step_s:.3g} units · <b>bubble</b> {tl.bubble_fraction:.1%} of each rank's time "
        f"(1F1B's closed form (p − 1)/(m + p − 1) = {closed:.1%})<br>"
        f"<b>activations held at once</b>, in micro-batch chunks (each 1/vpp of a stage's layers): {held}"
    )
