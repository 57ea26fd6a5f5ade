"""The planner panel's words: one plan as a line, and the estimate's summary (time to train, step and its likely
range, cost, notes), each figure with its provenance mark (widgets.provenance)."""

from __future__ import annotations

import html

from toolkit.estimate.result import Estimate
from toolkit.views.text import layout_text
from widgets.provenance import provenance_mark

__all__ = ["plan_html", "summary_html", "money_text"]


def plan_html(plan: dict, best: bool) -> str:
    """Where, which layout, device memory, step (and its likely range), MFU, days and cost of one plan."""
    return (
        f"{plan['devices']}x{plan['accelerator']} · {html.escape(layout_text(plan['layout']))} · "
        f"{plan['device_peak_bytes'] / 2**30:.1f} GiB · step {plan['step_s']:.3g} s "
        f"({plan['step_s_range'][0]:.3g}–{plan['step_s_range'][1]:.3g}) · MFU {plan['mfu']:.0%} · "
        f"{plan['train_days']:,.1f} days {money_text(plan['cost'], plan['currency'])}"
        + (" · <i>within the model's error of the best</i>" if plan.get("within_error") and not best else "")
    )


def money_text(amount: float | None, currency: str | None) -> str:
    return "" if amount is None else f"{amount:,.0f} {currency}"


def summary_html(result: Estimate) -> str:
    t, cost = result.time, result.cost
    lines = []
    if t.train_days is not None:
        mfu = f"MFU {t.mfu:.1%} {'given' if t.mfu_source == 'given' else 'modelled'}" if t.mfu is not None else ""
        mark = provenance_mark("given" if t.mfu_source == "given" else t.provenance)
        lines.append(
            f"<b>time to train:</b> {t.train_days:,.1f} days ({t.device_hours:,.0f} device-hours; {mfu}){mark}"
        )
    if t.step_s is not None and t.step_s_range:
        low, high = t.step_s_range
        lines.append(
            f"<b>step:</b> {t.step_s:.3g} s, likely {low:.3g}–{high:.3g} s (where measured steps fell around "
            f"the model's on runs it never saw){provenance_mark(t.provenance)}"
        )
    if cost.amount is not None:
        line = f"<b>cost:</b> {cost.amount:,.0f} {cost.currency} on {cost.instances} × {cost.offer}"
        if cost.spot_run:
            line += (
                f"; with interruptions {cost.spot_run['amount']:,.0f} "
                f"(checkpoint every {cost.spot_run['interval_s'] / 60:,.0f} min)"
            )
        lines.append(line)
    lines += [f"<small>{html.escape(n)}</small>" for n in result.notes]
    return "<br>".join(lines)
