"""The serving panel: a model on some GPUs, how it stores its weights and KV cache, how many requests of what length;
see at once the device's memory, the throughput-latency curve and the price per million tokens on each offer.

    from widgets.serving import ServingPanel
    ServingPanel(preset="llama2-7b", accelerator="A100-80GB")      # in a notebook cell

Every change builds a serving Job (`workload: inference`) and calls `toolkit.estimate.estimate`; the panel copies the
result into its figures and text (no maths here). A combination the Job refuses shows its one-line message and keeps
the last valid view.
"""

from __future__ import annotations

import html

import ipywidgets as W

from toolkit.estimate import estimate
from toolkit.estimate.serving import load_curve, prices_by_offer
from toolkit.specs import Job, SpecError, load_catalog
from toolkit.views.figures_serving import (
    serving_cost_figure,
    serving_curve_figure,
    serving_load_figure,
    serving_memory_figure,
)
from widgets.fallback import PanelText
from widgets.live_figure import LiveFigure
from widgets.provenance import provenance_mark

__all__ = ["ServingPanel"]

_STYLE = {"description_width": "110px"}


class ServingPanel(PanelText, W.VBox):
    panel_name = "the serving panel"

    def __init__(self, preset: str = "llama2-7b", accelerator: str = "A100-80GB", tp: int = 1, catalog=None, **values):
        self.catalog = catalog or load_catalog()
        self.result: dict | None = None
        c = self.controls = self._make_controls(preset, accelerator, tp)
        for name, value in values.items():
            c[name].value = value
        self.summary, self.error = W.HTML(), W.HTML()
        self.memory_fig, self.curve_fig, self.cost_fig = LiveFigure(), LiveFigure(), LiveFigure()
        self.load_fig = LiveFigure()
        for control in c.values():
            control.observe(lambda _change: self.update(), names="value")
        grid = W.GridBox(list(c.values()), layout=W.Layout(grid_template_columns="repeat(3, 320px)"))
        figures = [self.memory_fig, self.curve_fig, self.load_fig, self.cost_fig]
        super().__init__([grid, self.error, self.summary, *figures])
        self.update()

    def _make_controls(self, preset: str, accelerator: str, tp: int) -> dict:
        cat = self.catalog
        presets = sorted(n for n, p in cat.presets.items() if p.model.has_shape and not p.model.encoder)
        gpus = sorted(a.name for a in cat.accelerators.values() if a.memory_bytes and a.peak_flops("bf16"))
        return {
            "preset": W.Dropdown(options=presets, value=preset.lower(), description="model", style=_STYLE),
            "accelerator": W.Dropdown(
                options=gpus, value=cat.accelerator(accelerator).name, description="GPU", style=_STYLE
            ),
            "tp": W.Dropdown(options=[1, 2, 4, 8], value=tp, description="tensor parallel", style=_STYLE),
            "weights": W.Dropdown(
                options=["bf16", "fp8", "int8", "int4"], value="bf16", description="weights", style=_STYLE
            ),
            "kv_dtype": W.Dropdown(options=["auto", "fp8", "int8"], value="auto", description="KV cache", style=_STYLE),
            "concurrency": W.IntText(value=32, description="requests (0: max)", style=_STYLE),
            "input_tokens": W.IntText(value=1024, description="prompt tokens", style=_STYLE),
            "output_tokens": W.IntText(value=256, description="new tokens", style=_STYLE),
            "sparsity": W.Dropdown(options=["none", "2:4"], value="none", description="sparsity", style=_STYLE),
            "engine": W.Dropdown(
                options=["vllm", "sglang", "trtllm"], value="vllm", description="engine", style=_STYLE
            ),
            "rate": W.FloatText(value=0.0, description="req/s (0: the requests)", style=_STYLE),
            "max_tpot_ms": W.FloatText(value=0.0, description="TPOT bound ms", style=_STYLE),
        }

    def job(self) -> Job:
        """The serving Job the controls describe."""
        v = {name: control.value for name, control in self.controls.items()}
        return Job.from_dict(
            {
                "model": {"preset": v["preset"]},
                "workload": "inference",
                "cluster": {"accelerator": v["accelerator"], "count": v["tp"]},
                "parallel": {"tp": v["tp"]},
                "serving": {
                    "concurrency": v["concurrency"] or "max",
                    "input_tokens": v["input_tokens"],
                    "output_tokens": v["output_tokens"],
                    "weights": v["weights"],
                    "kv_dtype": v["kv_dtype"],
                    "sparsity": v["sparsity"],
                    "engine": v["engine"],
                    "rate": v["rate"] or None,
                    "max_tpot_s": v["max_tpot_ms"] / 1e3 or None,
                    "requests": 400,
                },
            },
            self.catalog,
        )

    def update(self) -> None:
        try:
            job = self.job()
            result = estimate(job, self.catalog)
            costs = prices_by_offer(job, self.catalog)
            curve = load_curve(job.resolve(self.catalog)[0], self.catalog)
        except SpecError as err:
            self.error.value = f"<p style='color:#d62728'>{html.escape(str(err))}</p>"
            return
        self.error.value = ""
        self.result = result
        s, cost_rows = result["serving"], costs
        tput = "-" if s["output_tokens_per_s"] is None else f"{s['output_tokens_per_s']:.0f}"
        if not result["memory"]["fits"]:
            self.summary.value = f"<p style='color:#d62728'>{html.escape(result['memory']['why_not'])}</p>"
            _show(self.memory_fig, serving_memory_figure(result))
            return
        load = s["load"] or {}
        where = f"{load.get('rate')} req/s" if load.get("mode") == "rate" else f"{s['concurrency']} request(s)"
        self.summary.value = (
            f"<p>{where} on {load.get('engine', '-')}: time to first token {_ms(s['ttft_s'])} (p99 "
            f"{_ms(s.get('ttft_s_p99'))}), per output token {_ms(s['tpot_s'])} (p99 {_ms(s.get('tpot_s_p99'))}), "
            f"{tput} output tokens/s a replica; KV cache {s['kv_bytes_per_token'] / 1024:.0f} KiB a token, at most "
            f"{s['max_concurrency']} requests at {s['max_context']} tokens{provenance_mark(s.get('provenance'))}</p>"
        )
        for widget, fig in (
            (self.memory_fig, serving_memory_figure(result)),
            (self.curve_fig, serving_curve_figure(result)),
            (self.load_fig, serving_load_figure(curve, max_tpot_s=job.serving.max_tpot_s)),
            (self.cost_fig, serving_cost_figure(cost_rows)),
        ):
            _show(widget, fig)


def _show(widget: W.Widget, fig) -> None:
    """Make the FigureWidget show `fig`, whose traces may differ in number from the last one's (a run's point)."""
    with widget.batch_update():
        widget.data = []
        widget.add_traces(list(fig.data))
        widget.layout = fig.layout


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"
