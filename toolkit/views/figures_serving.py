"""Serving figures: data in (an inference estimate, a serving plan), plotly figure out; the serving panel, notebook 09
and `toolkit estimate --workload inference --html` share them.

    serving_memory_figure(est)     # weights, KV cache, activations, runtime and free memory of a device
    serving_curve_figure(est)      # output tokens/s against time per output token as concurrency grows
    serving_cost_figure(rows)      # price per million output tokens per offer, on demand and spot
    serving_load_figure(points)    # TTFT and TPOT percentiles as the request rate rises (toolkit.estimate.load_curve)
"""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = [
    "serving_memory_figure",
    "serving_curve_figure",
    "serving_cost_figure",
    "serving_load_figure",
    "SERVING_MEMORY_PARTS",
]

GIB = 2**30
SERVING_MEMORY_PARTS = (
    ("weights_bytes", "weights", "#4C78A8"),
    ("kv_cache_bytes", "KV cache (the requests')", "#F58518"),
    ("activation_bytes", "activations (one step)", "#B279A2"),
    ("runtime_bytes", "CUDA context, workspaces, communicators", "#9D755D"),
    ("free_bytes", "free", "#E5E5E5"),
)


def serving_memory_figure(est: dict) -> go.Figure:
    """One stacked bar of a device's memory, with the engine's share (memory_fraction) marked."""
    mem = est["memory"]
    fig = go.Figure(
        [
            go.Bar(
                y=["a device"],
                x=[max(mem[key], 0.0) / GIB],
                name=label,
                orientation="h",
                marker_color=color,
                hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>",
            )
            for key, label, color in SERVING_MEMORY_PARTS
        ]
    )
    s = est["serving"]
    title = (
        f"{s['concurrency']} request(s) fit (at most {s['max_concurrency']} at {s['max_context']} tokens)"
        if mem["fits"]
        else f"does not fit: {s['concurrency']} requests, at most {s['max_concurrency']}"
    )
    fig.add_vline(x=mem["budget_bytes"] / GIB, line_dash="dash", annotation_text="engine's share")
    fig.update_layout(barmode="stack", title=title, xaxis_title="GiB", height=260, margin=dict(l=80, r=20, t=50, b=40))
    return fig


def serving_curve_figure(est: dict, measured: dict | None = None) -> go.Figure:
    """The throughput-latency curve (one point per concurrency), the job's own point highlighted, and a run's
    measured point where given (`toolkit generate`'s record)."""
    curve, s = est["serving"]["curve"], est["serving"]
    fig = go.Figure(
        go.Scatter(
            x=[p["tpot_s"] * 1e3 for p in curve],
            y=[p["output_tokens_per_s"] for p in curve],
            mode="lines+markers",
            name="estimate",
            text=[f"{p['concurrency']} requests" for p in curve],
            hovertemplate="%{text}: %{x:.1f} ms a token, %{y:.0f} tokens/s<extra></extra>",
        )
    )
    if s["tpot_s"] is not None:
        fig.add_trace(
            go.Scatter(
                x=[s["tpot_s"] * 1e3],
                y=[s["output_tokens_per_s"]],
                mode="markers",
                marker=dict(size=13, symbol="star"),
                name=f"{s['concurrency']} requests",
            )
        )
    if measured:
        fig.add_trace(
            go.Scatter(
                x=[measured["tpot_s"] * 1e3],
                y=[measured["output_tokens_per_s"]],
                mode="markers",
                marker=dict(size=12, symbol="x"),
                name="measured run",
            )
        )
    fig.update_layout(
        title="throughput against latency, a replica",
        xaxis_title="time per output token (ms)",
        yaxis_title="output tokens/s",
        height=320,
    )
    return fig


def serving_cost_figure(rows: list[dict]) -> go.Figure:
    """Bars of price per million output tokens: rows of {"offer", "on_demand", "spot"} (None: no price)."""
    fig = go.Figure()
    for key, label in (("on_demand", "on demand"), ("spot", "spot")):
        fig.add_trace(
            go.Bar(
                x=[r["offer"] for r in rows],
                y=[r.get(key) for r in rows],
                name=label,
                hovertemplate=f"{label}: $%{{y:.3f}} per million output tokens<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", title="price per million output tokens", yaxis_title="USD", height=300)
    return fig


def serving_load_figure(points: list[dict], max_ttft_s: float | None = None, max_tpot_s: float | None = None):
    """Time to first token and per output token (p50 solid, p99 dashed) against the request rate, with the SLO's
    bounds marked where given; saturated rates (the queue grows without end) are marked."""
    fig = go.Figure()
    rates = [p["rate"] for p in points]
    for key, label, color in (("ttft_s", "time to first token", "#4C78A8"), ("tpot_s", "per output token", "#F58518")):
        for pct, dash in (("p50", "solid"), ("p99", "dash")):
            fig.add_trace(
                go.Scatter(
                    x=rates,
                    y=[p[key][pct] * 1e3 for p in points],
                    mode="lines+markers",
                    name=f"{label} {pct}",
                    line=dict(color=color, dash=dash),
                    hovertemplate=f"{label} {pct}: %{{y:.1f}} ms at %{{x:.2f}} req/s<extra></extra>",
                )
            )
    for bound, label in ((max_ttft_s, "TTFT bound"), (max_tpot_s, "TPOT bound")):
        if bound:
            fig.add_hline(y=bound * 1e3, line_dash="dot", annotation_text=label)
    saturated = [p["rate"] for p in points if p["saturated"]]
    if saturated:
        fig.add_vrect(x0=min(saturated), x1=max(rates), fillcolor="#d62728", opacity=0.08, annotation_text="saturated")
    fig.update_layout(
        title="latency under load, a replica (Poisson arrivals)",
        xaxis_title="requests a second",
        yaxis_title="ms",
        yaxis_type="log",
        height=320,
    )
    return fig
