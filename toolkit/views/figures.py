"""Figures: data in, plotly figure out. Widgets, notebooks and `--html` use the same builders.

    fig = memory_figure(estimate(job))          # stacked bytes per device against the device's limit
    fig = step_figure(estimate(job))            # where a step's seconds go
    fig = metrics_figure(read_metrics(path), estimate(job))   # a run, measured beside the estimate
    fig = pareto_figure(search(...))            # plans: days against cost, the front highlighted
    fig = pipeline_figure(simulate(...).to_dict())   # a pipeline schedule's Gantt chart, rank by rank
    fig = comparison_figure({row: {part: value}}, unit, title)   # the notebooks' side-by-side comparisons

Nothing here displays a figure or computes a model figure; an absent value draws nothing.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..estimate.result import Estimate, MemoryPart, as_estimate

__all__ = [
    "memory_figure",
    "step_figure",
    "metrics_figure",
    "pareto_figure",
    "pipeline_figure",
    "write_html",
    "copy_into",
    "comparison_figure",
    "steps_figure",
    "MEMORY_PARTS",
    "STEP_PARTS",
    "PIPELINE_KINDS",
]

GIB = 2**30
MEMORY_PARTS = (
    ("params_bytes", "parameters", "#4C78A8"),
    ("grads_bytes", "gradients", "#F58518"),
    ("optimizer_bytes", "optimizer states", "#54A24B"),
    ("activations_bytes", "activations", "#B279A2"),
    ("transient_bytes", "transient at peak", "#BAB0AC"),
    ("pool_bytes", "allocator pool (fragmentation, workspaces)", "#D8B5A5"),
    ("context_bytes", "CUDA context", "#9D755D"),
    ("comm_bytes", "communication buffers", "#E45756"),
)
STEP_PARTS = (
    ("compute_s", "compute", "#4C78A8"),
    ("memory_bound_s", "memory-bound", "#72B7B2"),
    ("tp_comm_s", "tp comm", "#F58518"),
    ("ep_comm_s", "ep all-to-all", "#9D755D"),
    ("dp_comm_exposed_s", "dp comm (exposed)", "#E45756"),
    ("pp_comm_s", "pp sends", "#FF9DA6"),
    ("bubble_s", "pipeline bubble", "#BAB0AC"),
    ("optimizer_s", "optimizer", "#54A24B"),
)


def _memory_values(mem: MemoryPart) -> dict:
    parts = {k: getattr(mem, k) or 0.0 for k, _, _ in MEMORY_PARTS[:4]}
    peak = mem.peak_bytes
    parts["transient_bytes"] = max(peak - sum(parts.values()), 0.0) if peak is not None else 0.0
    terms = mem.device_terms or {}
    parts["pool_bytes"] = (terms.get("fragmentation_bytes") or 0.0) + (terms.get("workspace_bytes") or 0.0)
    parts["context_bytes"] = terms.get("context_bytes") or 0.0
    parts["comm_bytes"] = terms.get("comm_bytes") or 0.0
    return parts


def memory_figure(est: Estimate | dict) -> go.Figure:
    """One stacked bar (GiB per device): the tensors up to the step's peak, then what the device holds beside
    them (allocator pool, CUDA context, communication buffers), with the usable and total device memory."""
    mem = as_estimate(est).memory
    parts = _memory_values(mem)
    bars = [
        dict(
            type="bar",
            y=["per device"],
            x=[parts[key] / GIB],
            name=label,
            orientation="h",
            marker_color=color,
            hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>",
        )
        for key, label, color in MEMORY_PARTS
    ]
    title, lines = "memory per device", []
    if mem.usable_bytes:
        usable, total = mem.usable_bytes / GIB, mem.device_bytes / GIB
        lines = [_vline(usable, "dash"), _vline(total, "solid")]
        peak = (mem.device_peak_bytes or mem.peak_bytes or 0) / GIB
        title = (
            f"device peak {peak:.1f} GiB of {usable:.1f} GiB usable: fits"
            if mem.fits
            else f"device peak {peak:.1f} GiB: {peak - usable:.1f} GiB over the {usable:.1f} GiB usable"
        )
    return _bar_figure(bars, title, "GiB", lines)


def step_figure(est: Estimate | dict) -> go.Figure:
    """Seconds of one optimizer step by part (the step-time model's breakdown)."""
    t = as_estimate(est).time
    breakdown = t.breakdown or {}
    bars = [
        dict(
            type="bar",
            y=["step"],
            x=[breakdown.get(key, 0.0)],
            name=label,
            orientation="h",
            marker_color=color,
            hovertemplate=f"{label}: %{{x:.3g}} s<extra></extra>",
        )
        for key, label, color in STEP_PARTS
    ]
    title = (
        "step time: needs an accelerator with published peak and bandwidth"
        if t.step_s is None
        else f"step {t.step_s:.3g} s · {t.tokens_per_s:,.0f} tokens/s · MFU {t.mfu_modelled:.0%}"
    )
    return _bar_figure(bars, title, "seconds")


def _vline(x: float, dash: str) -> dict:
    """A vertical line across the plot at x (what `add_vline` draws, built as data: the planner redraws on every
    control change, and add_vline's checks cost it 9 ms a line)."""
    return dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain", line=dict(color="black", dash=dash))


def _bar_figure(bars: list[dict], title: str, unit: str, lines: list[dict] = ()) -> go.Figure:
    """A one-row stacked bar chart, the layout given in one piece (validated once, not attribute by attribute)."""
    return go.Figure(
        dict(
            data=bars,
            layout=dict(
                barmode="stack",
                title=dict(text=title),
                xaxis=dict(title=dict(text=unit)),
                height=200,
                shapes=list(lines),
                margin=dict(l=10, r=10, t=40, b=30),
                legend=dict(orientation="h", y=-0.5),
            ),
        )
    )


def metrics_figure(records: list[dict], est: Estimate | dict | None = None, rank_memory: list[dict] = ()) -> go.Figure:
    """Loss, throughput, MFU (or TFLOP/s) and memory of a run, step by step; the estimate as dashed lines. The
    process's memory (RSS on CPU, the allocator on GPUs) is one line on the left axis; `rank_memory`
    (toolkit.runs.folder.read_rank_memory: each rank's tensor peak over its first steps, the estimate's own measure) adds one
    marker per rank beside the estimated peak, on the right axis: on a CPU the process holds 10-100x the tensors, and
    one axis would flatten the comparison that matters onto zero."""
    use_mfu = any(r.get("mfu") is not None for r in records)
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=("loss", "tokens/s", "MFU" if use_mfu else "TFLOP/s per device", "memory"),
        specs=[[{}, {}], [{}, {"secondary_y": True}]],
    )
    kind = records[-1].get("mem_kind", "memory") if records else "memory"
    _add_measured(fig, records, use_mfu, kind)
    if rank_memory:
        _add_rank_memory(fig, rank_memory)
    steps = [r["step"] for r in records]
    if est is not None and steps:
        _add_estimated(fig, as_estimate(est), [min(steps), max(steps)], use_mfu)
    fig.update_yaxes(title_text=f"process, GiB ({kind})", rangemode="tozero", row=2, col=2, secondary_y=False)
    fig.update_yaxes(title_text="tensors, GiB", rangemode="tozero", row=2, col=2, secondary_y=True)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(height=480, margin=dict(l=10, r=10, t=40, b=30), legend=dict(orientation="h", y=-0.15))
    return fig


def _add_measured(fig: go.Figure, records: list[dict], use_mfu: bool, kind: str) -> None:
    """The run's own lines, one panel each: loss (and held-out loss), tokens/s, MFU or TFLOP/s, process memory."""
    steps = [r["step"] for r in records]
    fig.add_trace(go.Scatter(x=steps, y=[r.get("loss") for r in records], name="loss", mode="lines"), 1, 1)
    evals = [r for r in records if r.get("eval_loss") is not None]
    fig.add_trace(
        go.Scatter(
            x=[r["step"] for r in evals], y=[r["eval_loss"] for r in evals], name="held-out loss", mode="lines+markers"
        ),
        1,
        1,
    )
    fig.add_trace(go.Scatter(x=steps, y=[r.get("tokens_per_s") for r in records], name="tokens/s", mode="lines"), 1, 2)
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=[r.get("mfu") if use_mfu else r.get("tflops") for r in records],
            name="MFU" if use_mfu else "TFLOP/s",
            mode="lines",
        ),
        2,
        1,
    )
    fig.add_trace(
        go.Scatter(
            x=steps, y=[(r.get("mem_bytes") or 0) / GIB for r in records], name=f"measured ({kind})", mode="lines"
        ),
        2,
        2,
    )


def _add_rank_memory(fig: go.Figure, rank_memory: list[dict]) -> None:
    """One marker per rank's tensor peak, on the memory panel's right axis (the estimate's own measure)."""
    fig.add_trace(
        go.Scatter(
            x=[max(r["steps"]) for r in rank_memory],
            y=[r["peak_bytes"] / GIB for r in rank_memory],
            text=[f"rank {r['rank']} (stage {r['stage']})" for r in rank_memory],
            mode="markers",
            name=f"tensor peak per rank ({rank_memory[0]['instrument']})",
        ),
        2,
        2,
        secondary_y=True,
    )


def _add_estimated(fig: go.Figure, est: Estimate, span: list[int], use_mfu: bool) -> None:
    """The estimate as dashed lines across the run's steps: tokens/s (with its likely range), MFU, tensor peak."""
    if est.time.tokens_per_s:
        fig.add_trace(
            go.Scatter(
                x=span, y=[est.time.tokens_per_s] * 2, name="estimated tokens/s", mode="lines", line_dash="dash"
            ),
            1,
            2,
        )
        if est.time.step_s_range:
            _add_rate_range(fig, est, span)
    if use_mfu and est.time.mfu_modelled:
        fig.add_trace(
            go.Scatter(x=span, y=[est.time.mfu_modelled] * 2, name="estimated MFU", mode="lines", line_dash="dash"),
            2,
            1,
        )
    if est.memory.peak_bytes:
        fig.add_trace(
            go.Scatter(
                x=span,
                y=[est.memory.peak_bytes / GIB] * 2,
                name="estimated peak (tensors)",
                mode="lines",
                line_dash="dash",
            ),
            2,
            2,
            secondary_y=True,
        )


def _add_rate_range(fig: go.Figure, est: Estimate, span: list[int]) -> None:
    """The model's held-out spread of tokens/s as a shaded band: an invisible lower line, the upper filled to it."""
    low_s, high_s = est.time.step_s_range
    tokens_per_step = est.time.tokens_per_s * est.time.step_s
    fig.add_trace(
        go.Scatter(
            x=span, y=[tokens_per_step / high_s] * 2, mode="lines", line_width=0, showlegend=False, hoverinfo="skip"
        ),
        1,
        2,
    )
    fig.add_trace(
        go.Scatter(
            x=span,
            y=[tokens_per_step / low_s] * 2,
            mode="lines",
            line_width=0,
            fill="tonexty",
            fillcolor="rgba(99,110,250,0.15)",
            name="estimated range",
        ),
        1,
        2,
    )


def pareto_figure(result: dict) -> go.Figure:
    """Every plan shown (days against cost) and the Pareto front as a line."""

    def text(p):
        lay = p["layout"]
        return f"{p['devices']}x{p['accelerator']} dp{lay['dp']} tp{lay['tp']} pp{lay['pp']} ZeRO-{lay['zero']}"

    plans, front = result["plans"], result["pareto"]
    currency = next((p["currency"] for p in plans if p.get("currency")), "")
    cost = "cost_usd" if any(p.get("cost_usd") is not None for p in plans) else "cost"
    unit = "USD" if cost == "cost_usd" else currency
    fig = go.Figure(
        [
            go.Scatter(
                x=[p["train_days"] for p in plans],
                y=[p.get(cost) for p in plans],
                mode="markers",
                name="plans",
                text=[text(p) for p in plans],
                hovertemplate="%{text}<br>%{x:.1f} days, %{y:,.0f}<extra></extra>",
            ),
            go.Scatter(
                x=[p["train_days"] for p in front],
                y=[p.get(cost) for p in front],
                mode="lines+markers",
                name="Pareto front",
                text=[text(p) for p in front],
                hovertemplate="%{text}<br>%{x:.1f} days, %{y:,.0f}<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title=f"{result['fitting']:,} of {result['evaluated']:,} layouts fit",
        xaxis_title="days to train",
        yaxis_title=f"cost ({unit})",
        height=360,
        margin=dict(l=10, r=10, t=40, b=30),
    )
    return fig


def comparison_figure(
    rows: dict[str, dict[str, float | None]],
    unit: str,
    title: str,
    stacked: bool = True,
    limits: dict[str, float] | None = None,
    markers: dict[str, dict[str, float]] | None = None,
    log: bool = False,
) -> go.Figure:
    """Rows side by side, one horizontal bar each ({row: {part: value}}): parts stacked (a technique's memory
    by kind) or grouped (a cost on demand and on spot). `limits` draws named vertical lines (a device's usable
    memory), `markers` one point per row for each name (a traced peak beside the estimated bar). A None value
    draws nothing. For the notebooks' comparisons; the numbers behind them are asserted where computed."""
    labels = list(rows)
    parts = list(dict.fromkeys(part for values in rows.values() for part in values))
    data = [
        dict(
            type="bar",
            orientation="h",
            y=labels,
            x=[rows[r].get(part) for r in labels],
            name=part,
            hovertemplate=f"{part}: %{{x:,.4g}} {unit}<extra>%{{y}}</extra>",
        )
        for part in parts
    ]
    for name, points in (markers or {}).items():
        data.append(
            dict(
                type="scatter",
                mode="markers",
                y=list(points),
                x=list(points.values()),
                name=name,
                marker=dict(symbol="diamond", size=10, color="black"),
                hovertemplate=f"{name}: %{{x:,.4g}} {unit}<extra>%{{y}}</extra>",
            )
        )
    shapes = [_vline(x, "dash") for x in (limits or {}).values()]
    notes = [
        dict(x=x, y=1, xref="x", yref="paper", text=name, showarrow=False, yanchor="bottom")
        for name, x in (limits or {}).items()
    ]
    plot_px = 34 * len(labels) * (1 if stacked else max(1, len(parts)) * 0.6)
    return go.Figure(
        dict(
            data=data,
            layout=dict(
                barmode="stack" if stacked else "group",
                title=dict(text=title),
                shapes=shapes,
                annotations=notes,
                xaxis=dict(title=dict(text=unit), type="log" if log else "linear"),
                yaxis=dict(autorange="reversed"),
                height=plot_px + 150,
                margin=dict(l=10, r=10, t=50, b=90),
                legend=dict(orientation="h", yanchor="top", y=-55 / plot_px),
            ),
        )
    )  # (below the axis title, in pixels)


def steps_figure(
    series: dict[str, list[tuple[int, float | None]]],
    title: str,
    unit: str,
    log: bool = False,
    marked: dict[str, list[int]] | None = None,
) -> go.Figure:
    """Lines over steps ({name: [(step, value)]}), e.g. a run's loss scale and loss; `marked` names steps to
    flag on the first line (skipped steps)."""
    data = [
        dict(type="scatter", mode="lines+markers", x=[s for s, _ in points], y=[v for _, v in points], name=name)
        for name, points in series.items()
    ]
    first = next(iter(series.values()), [])
    for name, steps in (marked or {}).items():
        where = dict(first)
        data.append(
            dict(
                type="scatter",
                mode="markers",
                x=steps,
                y=[where.get(s) for s in steps],
                name=name,
                marker=dict(symbol="x", size=11, color="#d62728"),
            )
        )
    return go.Figure(
        dict(
            data=data,
            layout=dict(
                title=dict(text=title),
                xaxis=dict(title=dict(text="step")),
                yaxis=dict(title=dict(text=unit), type="log" if log else "linear"),
                height=320,
                margin=dict(l=10, r=10, t=40, b=30),
                legend=dict(orientation="h", y=-0.25),
            ),
        )
    )


PIPELINE_KINDS = (("F", "forward", "#4C78A8"), ("B", "backward", "#F58518"), ("W", "weight gradients", "#54A24B"))


def pipeline_figure(timeline: dict, measured: dict | None = None) -> go.Figure:
    """A schedule's Gantt chart (toolkit.estimate.pipeline Timeline.to_dict()): one row per rank, a bar per
    micro-batch chunk labelled with its number; `measured`, a timeline of the same shape from a real run,
    is drawn as a second row per rank."""
    rows = [("simulated", timeline)] + ([("measured", measured)] if measured else [])
    fig = go.Figure()
    for label, tl in rows:
        suffix = f" ({label})" if measured else ""
        for kind, name, color in PIPELINE_KINDS:
            spans = [s for s in tl["timeline"] if s["kind"] == kind]
            if not spans:
                continue
            fig.add_trace(
                go.Bar(
                    y=[f"rank {s['rank']}{suffix}" for s in spans],
                    x=[s["end_s"] - s["start_s"] for s in spans],
                    base=[s["start_s"] for s in spans],
                    orientation="h",
                    name=name + suffix,
                    marker_color=color,
                    opacity=1.0 if label == "simulated" else 0.6,
                    text=[str(s["micro"]) for s in spans],
                    textposition="inside",
                    insidetextanchor="middle",
                    customdata=[[s["micro"], s["stage"]] for s in spans],
                    hovertemplate=f"{name}: micro-batch %{{customdata[0]}}, stage %{{customdata[1]}}<br>"
                    "%{base:.3g} to %{x:.3g} s long<extra></extra>",
                )
            )
    title = (
        f"{timeline['schedule']}: {timeline['stages']} stages, {timeline['microbatches']} micro-batches"
        + (f", vpp {timeline['vpp']}" if timeline["vpp"] > 1 else "")
        + f" · step {timeline['step_s']:.3g} s · bubble {timeline['bubble_fraction']:.1%}"
    )
    fig.update_layout(
        barmode="overlay",
        title=title,
        xaxis_title="seconds",
        height=120 + 40 * timeline["stages"] * len(rows),
        margin=dict(l=10, r=10, t=40, b=30),
        legend=dict(orientation="h", y=-0.2),
        yaxis=dict(autorange="reversed"),
    )
    return fig


def write_html(path: str, figures) -> None:
    """The figures on one page (plotly.js from its CDN, so the file stays small): what `--html` writes."""
    from pathlib import Path

    parts = [fig.to_html(full_html=False, include_plotlyjs="cdn" if i == 0 else False) for i, fig in enumerate(figures)]
    Path(path).write_text(
        "<html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>", encoding="utf-8"
    )


def copy_into(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Make a FigureWidget show `fig` (same traces in the same order): data, title, lines, in one update."""
    with widget.batch_update():
        for old, new in zip(widget.data, fig.data):
            old.update(x=new.x, y=new.y, text=new.text)
        widget.layout.title = fig.layout.title
        widget.layout.shapes = fig.layout.shapes
