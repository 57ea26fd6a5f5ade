"""The planner panel: configure a Job with controls, see at once whether it fits, how fast, at what cost.

    from widgets.planner import PlannerPanel
    panel = PlannerPanel(preset="llama2-7b", accelerator="H100-SXM", count=8)
    panel            # in a notebook cell

Every control change builds a new Job and calls `toolkit.estimate.estimate_result` (typed parts); the panel only
copies the result into figures and text (no maths here). A combination the Job rejects shows the
message beside the panel, the control it names highlighted, and leaves the last valid view up.
Buttons: export the job as YAML, ask the doctor for fixes (one click applies a fix), and search
the best layouts (the planner's top plans and their Pareto front). Run trains the job for real, or, where
this machine cannot hold it, a scaled-down proxy with the same kinds of parallelism (toolkit.runs.proxy); what Run
will start is said in words before anyone presses it, and the launcher panel appears under the planner.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as W

from toolkit.estimate import Estimate, estimate_result
from toolkit.runs.proxy import RunPlan, local_devices, run_plan
from toolkit.specs import PRECISIONS, Job, SpecError, load_catalog
from toolkit.specs.axes import AXES
from toolkit.views.figures import copy_into, memory_figure, pareto_figure, step_figure
from widgets.fallback import PanelText
from widgets.live_figure import LiveFigure
from widgets.planner_text import plan_html, summary_html

__all__ = ["PlannerPanel"]

_FIELD_OF_CONTROL = {
    "preset": "model.preset",
    "seq_len": "model.seq_len",
    "global_batch": "batch.global_batch",
    "precision": "precision.mode",
    "optimizer": "optimizer.name",
    **{axis.name: axis.field for axis in AXES},
    "accelerator": "cluster.accelerator",
    "count": "cluster.count",
    "tokens_b": "tokens",
    "offer": "cost.offer",
    "spot": "cost.spot",
}


def _fit_count_html(result: dict, cluster: str) -> str:
    """How many layouts fit; when none does, that the job cannot run as planned here (Run can only train a proxy)."""
    if result["fitting"]:
        return f"<p>{result['fitting']:,} of {result['evaluated']:,} layouts fit (apply sets the controls)</p>"
    return (
        f"<p style='color:#d62728'><b>No layout fits:</b> none of the {result['evaluated']:,} layouts of this job "
        f"fits {html.escape(cluster)}, so the job cannot run as planned on it. Give it more devices or larger ones, "
        "or try the doctor's fixes (a smaller precision, LoRA or QLoRA for a fine-tune); Run can only train a proxy "
        "of it.</p>"
    )


def _estimated(model) -> bool:
    """A decoder the estimate prices (Mixtures of Experts included)."""
    return model.has_shape and not model.encoder


def axis_control(axis, style: dict) -> W.Widget:
    """The panel's control for one layout axis of toolkit.specs.axes, at the axis's default."""
    if axis.control == "checkbox":
        return W.Checkbox(value=axis.default, description=axis.label)
    if axis.control == "slider":
        return W.IntSlider(
            value=axis.default, min=axis.choices[0], max=axis.choices[-1], description=axis.label, style=style
        )
    if axis.control == "toggle":
        return W.ToggleButtons(
            options=list(axis.choices),
            value=axis.default,
            description=axis.label,
            style={**style, "button_width": "40px"},
        )
    return W.Dropdown(options=list(axis.choices), value=axis.default, description=axis.label, style=style)


class PlannerPanel(PanelText, W.VBox):
    """Controls that describe a Job, the views of its estimate, and buttons that act on it. Building the controls
    and the rows the buttons show is done by the module's functions; the class keeps the state and the wiring."""

    panel_name = "the planner"

    def __init__(
        self,
        preset: str = "llama2-7b",
        accelerator: str = "H100-SXM",
        count: int = 8,
        tokens: float | None = None,
        catalog=None,
        run_dir: str | Path = "runs/planner",
        here=None,
        **layout,
    ):
        self.catalog = catalog or load_catalog()
        self.job: Job | None = None
        self.result: Estimate | None = None
        self.run_dir, self.here = Path(run_dir), here or local_devices()
        self.run_plan: RunPlan | None = None
        self.launcher = None  # the LauncherPanel of the last Run
        self.last_update_s = 0.0
        self._quiet = False
        self._fixes_for: dict | None = None  # the job the fix list was made for
        offers = _offers_for(self.catalog, accelerator)
        c = self.controls = _make_controls(self.catalog, preset, accelerator, count, tokens, offers)
        for name, value in layout.items():
            c[name].value = value
        self._make_views()
        self._make_buttons()
        self._connect()
        super().__init__(self._children())
        self.refresh()

    # ---- building --------------------------------------------------------------------------------
    def _make_views(self) -> None:
        """What shows the estimate: the two figures, the summary, the error line and the boxes buttons fill."""
        self.memory_fig = LiveFigure(memory_figure(_EMPTY))
        self.step_fig = LiveFigure(step_figure(_EMPTY))
        self.summary = W.HTML()
        self.error = W.HTML()
        self.fixes_box = W.VBox()
        self.best_box = W.VBox()
        self.run_note = W.HTML()
        self.run_area = W.VBox()

    def _make_buttons(self) -> None:
        """Export, suggest fixes, best layouts and Run (with its step count)."""
        self.export_path = W.Text(value="job.yaml", description="file", layout=W.Layout(width="240px"))
        self.export_button = W.Button(description="export job.yaml", icon="download")
        self.suggest_button = W.Button(description="suggest fixes", icon="medkit")
        self.best_button = W.Button(description="best layouts", icon="search")
        self.run_steps = W.BoundedIntText(
            value=30,
            min=1,
            max=100_000,
            description="steps",
            layout=W.Layout(width="160px"),
            style={"description_width": "40px"},
        )
        self.run_button = W.Button(description="Run", icon="play", button_style="success")

    def _connect(self) -> None:
        """Buttons to their actions; every control to a redraw, the accelerator first (it narrows the offers)."""
        self.run_button.on_click(lambda _b: self.run())
        self.run_steps.observe(lambda _c: self._show_run_plan(self.run_plan), names="value")
        self.export_button.on_click(lambda _b: self.export())
        self.suggest_button.on_click(lambda _b: self.suggest())
        self.best_button.on_click(lambda _b: self.best_layouts())
        self.controls["accelerator"].observe(self._accelerator_changed, names="value")
        for control in self.controls.values():
            control.observe(self._changed, names="value")

    def _children(self) -> list[W.Widget]:
        """The panel top to bottom: controls, the estimate's views, the buttons and what they show."""
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 300px)"))
        buttons = W.HBox([self.export_path, self.export_button, self.suggest_button, self.best_button])
        defaults = W.HTML(
            "<small>* 0 means the preset's own: its sequence length, its published global batch "
            "and token budget</small>"
        )
        run_row = W.HBox([self.run_button, self.run_steps])
        return [
            grid,
            defaults,
            self.error,
            self.memory_fig,
            self.step_fig,
            self.summary,
            buttons,
            self.fixes_box,
            self.best_box,
            run_row,
            self.run_note,
            self.run_area,
        ]

    # ---- controls --------------------------------------------------------------------------------
    def job_data(self) -> dict:
        """The Job the controls describe, as the plain dict `Job.from_dict` reads."""
        return _job_data({name: control.value for name, control in self.controls.items()})

    def set_job(self, data: dict) -> None:
        """Set the controls from a job dict (e.g. a doctor's fix), then re-estimate once."""
        c, self._quiet = self.controls, True
        try:
            for section, name in [(axis.section, axis.name) for axis in AXES] + [("optimizer", "name")]:
                value = (data.get(section) or {}).get(name)
                control = c["optimizer" if section == "optimizer" else name]
                if value is not None and value in getattr(control, "options", [value]):
                    control.value = value
        finally:
            self._quiet = False
        self.refresh()

    # ---- updating ------------------------------------------------------------------------------------
    def _accelerator_changed(self, change) -> None:
        offer = self.controls["offer"]
        quiet, self._quiet = self._quiet, True  # (one redraw, by the accelerator's own observer)
        try:
            kept = offer.value
            offer.options = _offers_for(self.catalog, change["new"])
            offer.value = kept if kept in offer.options else "none"
        finally:
            self._quiet = quiet

    def _changed(self, _change) -> None:
        if not self._quiet:
            self.refresh()

    def refresh(self) -> None:
        """Rebuild the Job from the controls and show its estimate (or why it is not valid)."""
        began = time.perf_counter()
        for control in self.controls.values():
            control.layout.border = None
        try:
            job = Job.from_dict(self.job_data(), self.catalog)
            result = estimate_result(job, self.catalog)
        except SpecError as err:
            self._show_error(err)
            self.last_update_s = time.perf_counter() - began
            return
        self.job, self.result = job, result
        if self._fixes_for is not None and job.to_dict() != self._fixes_for:  # a fix list is for one job
            self.fixes_box.children, self._fixes_for = [], None
        self.error.value = ""
        copy_into(self.memory_fig, memory_figure(result))
        copy_into(self.step_fig, step_figure(result))
        self.summary.value = summary_html(result)
        peak = result.memory.device_peak_bytes or result.memory.peak_bytes  # (estimated once, above)
        self._show_run_plan(run_plan(job, self.here, device_peak_bytes=peak, unfit=_unfit_text(result, peak)))
        self.last_update_s = time.perf_counter() - began

    def _show_run_plan(self, plan: RunPlan | None) -> None:
        """Say what Run will start (the job, a proxy and what it scaled, or nothing and why) before it is pressed."""
        self.run_plan = plan = plan and plan.with_steps(self.run_steps.value)
        busy = self.launcher is not None and self.launcher.running
        self.run_button.disabled = plan is None or plan.job is None or busy
        self.run_steps.disabled = plan is None or not plan.proxy
        lines = ["Run: the controls are not valid"] if plan is None else plan.lines()
        self.run_note.value = "<small>" + "<br>".join(html.escape(line) for line in lines) + "</small>"

    def _show_error(self, err: SpecError) -> None:
        names = [n for n, f in _FIELD_OF_CONTROL.items() if err.field == f or err.field.startswith(f + ".")]
        for name in names:
            self.controls[name].layout.border = "2px solid #d62728"
        where = f" (control: {', '.join(names)})" if names else ""
        self.error.value = f"<div style='color:#d62728'><b>not valid{where}:</b> {html.escape(str(err))}</div>"
        _mark_stale(self.memory_fig, self.step_fig, self.summary)  # the last valid view stays, marked as such
        self._show_run_plan(None)

    # ---- buttons -------------------------------------------------------------------------------------
    def run(self, nproc: int | None = None):
        """Train what `run_plan` says (the job, or its proxy for `steps` steps) in a new folder under run_dir,
        through a LauncherPanel shown under the planner; returns it (Stop and Resume are its buttons)."""
        from widgets.launcher import LauncherPanel, fresh_folder

        plan = self.run_plan
        if plan is None or plan.job is None or (self.launcher is not None and self.launcher.running):
            return self.launcher
        job = plan.job
        out = fresh_folder(self.run_dir)
        self.launcher = LauncherPanel(job, out, nproc=nproc or plan.nproc)
        self.launcher.observe(lambda _c: self._show_run_plan(self.run_plan), names="state")
        what = "a proxy of the job" if plan.proxy else "the job"
        self.run_area.children = [
            W.HTML(f"<b>Running {what}</b> in <code>{html.escape(str(out))}</code>"),
            self.launcher,
        ]
        self.launcher.launch()
        return self.launcher

    def export(self) -> Path | None:
        """Write the current (resolved) job as YAML to the path in the text box."""
        if self.result is None:
            return None
        path = Path(self.export_path.value)
        Job.from_dict(self.result.job, self.catalog).to_yaml(path)
        self.summary.value = summary_html(self.result) + f"<p>wrote {html.escape(str(path))}</p>"
        return path

    def suggest(self) -> list[dict]:
        """The doctor's fixes for this job, each a button that applies it."""
        from toolkit.plan.doctor import diagnose_job

        if self.job is None:
            return []
        report = diagnose_job(self.job, self.catalog)
        fits = self.result is not None and self.result.memory.fits
        self.fixes_box.children = _fix_rows(report, fits, self.apply_fix)
        self._fixes_for = self.job.to_dict()
        return report["fixes"]

    def apply_plan(self, plan: dict) -> None:
        """Set the controls to one of the best layouts: devices, accelerator and the layout."""
        from toolkit.plan.search import plan_job

        job = plan_job(self.job, plan)
        quiet, self._quiet = self._quiet, True
        try:
            self.controls["accelerator"].value = job.cluster.accelerator
            self.controls["count"].value = job.cluster.count
            self.controls["global_batch"].value = plan["global_batch"]  # (the default follows dp: keep the plan's)
        finally:
            self._quiet = quiet
        self.set_job(job.to_dict())

    def apply_fix(self, fixed: dict) -> None:
        """Apply what a fix changes (only that: fixes compose), then list the fixes for the job it leaves."""
        self.set_job(_changes(fixed, self._fixes_for or {}))
        self.suggest()

    def best_layouts(self, top: int = 8) -> dict | None:
        """The planner's best layouts on this cluster (or on the chosen offer): a table and the Pareto plot."""
        if self.job is None:
            return None
        v = self.controls
        result = _search_here(self.job, self.catalog, v, top)
        cluster = f"{v['count'].value} × {v['accelerator'].value}"
        table = W.VBox([W.HTML(_fit_count_html(result, cluster)), *_plan_rows(result["plans"], self.apply_plan)])
        self._plans = result["plans"]
        children = [table]
        if result["pareto"]:
            children.append(LiveFigure(pareto_figure(result)))
        self.best_box.children = children
        return result


# ---- controls ----------------------------------------------------------------------------------------
def _offers_for(catalog, accelerator: str) -> list[str]:
    """The offers that carry the chosen accelerator (a job on one device cannot be priced on another's)."""
    name = catalog.accelerator(accelerator).name
    return ["none"] + sorted(o.name for o in catalog.offers.values() if catalog.accelerator(o.accelerator).name == name)


def _make_controls(catalog, preset, accelerator, count, tokens, offers: list[str]) -> dict:
    """One control per Job field the panel sets, named as _job_data reads them; layout axes from the registry."""
    style = {"description_width": "110px"}
    return {
        "preset": W.Dropdown(
            options=sorted(p.name for p in catalog.presets.values() if _estimated(p.model)),
            value=preset,
            description="model",
            style=style,
        ),
        "seq_len": W.IntText(value=0, description="sequence *", style=style),
        "global_batch": W.IntText(value=0, description="global batch *", style=style),
        "precision": W.Dropdown(options=["auto", *PRECISIONS], value="auto", description="precision", style=style),
        "optimizer": W.Dropdown(options=["adamw", "adam", "sgd", "adamw-8bit"], description="optimizer", style=style),
        **{axis.name: axis_control(axis, style) for axis in AXES},
        "accelerator": W.Dropdown(
            options=[a.name for a in catalog.accelerators.values()],
            value=accelerator,
            description="accelerator",
            style=style,
        ),
        "count": W.IntText(value=count, description="devices", style=style),
        "tokens_b": W.FloatText(value=0.0 if tokens is None else tokens / 1e9, description="tokens, B *", style=style),
        "offer": W.Dropdown(options=offers, value="none", description="cloud offer", style=style),
        "spot": W.Checkbox(value=False, description="spot prices"),
    }


def _job_data(v: dict) -> dict:
    """The controls' values as the plain dict `Job.from_dict` reads; 0 (and "auto", "none") leave a field unset."""
    model = {"preset": v["preset"]}
    if v["seq_len"]:
        model["seq_len"] = v["seq_len"]
    data = {
        "model": model,
        "batch": {"global_batch": v["global_batch"]} if v["global_batch"] else {},
        "precision": {"mode": None if v["precision"] == "auto" else v["precision"]},
        "optimizer": {"name": v["optimizer"]},
        "parallel": {},
        "memory": {},
        "cluster": {"accelerator": v["accelerator"], "count": v["count"]},
        "cost": {"offer": None if v["offer"] == "none" else v["offer"], "spot": v["spot"]},
    }
    for axis in AXES:
        data[axis.section][axis.name] = v[axis.name]
    if v["tokens_b"]:
        data["tokens"] = v["tokens_b"] * 1e9
    return data


def _changes(fixed: dict, base: dict) -> dict:
    """What a fix changes against the job the fixes were made for, so that applying one keeps earlier ones."""
    return {
        section: {k: v for k, v in (fixed.get(section) or {}).items() if (base.get(section) or {}).get(k) != v}
        for section in ("parallel", "memory", "batch", "optimizer")
    }


def _search_here(job: Job, catalog, controls: dict, top: int) -> dict:
    """The planner's search on the controls' cluster, or on whole instances of the chosen offer ranked by cost."""
    from toolkit.plan import search

    offers = [controls["offer"].value] if controls["offer"].value != "none" else None
    gpus = None if offers else (controls["count"].value, controls["accelerator"].value)
    return search(
        job,
        catalog,
        gpus=gpus,
        offers=offers,
        max_gpus=controls["count"].value,
        objective="cost" if offers else "time",
        top=top,
    )


# ---- rendering ---------------------------------------------------------------------------------------
def _unfit_text(result: Estimate, peak_bytes: float | None) -> str | None:
    """Why the job cannot run here as estimated, in the words Run's note uses; None when it fits or nobody knows."""
    mem = result.memory
    if mem.fits is not None and not mem.fits and mem.usable_bytes:
        return f"{peak_bytes / 2**30:,.1f} GiB a device, more than its {mem.usable_bytes / 2**30:,.1f} GiB"
    return None


def _mark_stale(memory_fig, step_fig, summary: W.HTML) -> None:
    """Keep the last valid view up, its figures' titles and the summary marked as out of date (once)."""
    for fig in (memory_fig, step_fig):
        title = fig.layout.title.text or ""
        if not title.startswith(STALE):
            fig.layout.title = STALE + title
    summary.value = (
        f"<div style='opacity:0.5'>{summary.value}</div>"
        if not summary.value.startswith("<div style='opacity:0.5'>")
        else summary.value
    )


def _fix_rows(report: dict, fits: bool, apply_fix) -> list[W.Widget]:
    """The doctor's findings, then one button per fix (green where it fits) and one for the fixes together."""
    rows: list[W.Widget] = [W.HTML("<b>" + html.escape(f) + "</b>") for f in report["findings"]]
    for fix in report["fixes"][:8]:
        change = "" if fix["step_change"] is None else f", step {fix['step_change']:+.0%}"
        label = f"{fix['change']}: {fix['device_peak_bytes'] / 2**30:.1f} GiB{change}" + (
            "" if fix["fits"] else " (still over)"
        )
        button = W.Button(
            description=label, layout=W.Layout(width="auto"), button_style="success" if fix["fits"] else ""
        )
        button.on_click(lambda _b, job=fix["job"]: apply_fix(job))
        rows.append(button)
    if report.get("combined") and report["combined"]["fits"]:
        combined = report["combined"]
        button = W.Button(
            description="together: " + " + ".join(combined["changes"]),
            layout=W.Layout(width="auto"),
            button_style="success",
        )
        button.on_click(lambda _b, job=combined["job"]: apply_fix(job))
        rows.append(button)
    if not report["fixes"]:
        rows.append(W.HTML("fits: no change needed for memory" if fits else "no single change helps"))
    return rows


def _plan_rows(plans: list[dict], apply_plan) -> list[W.Widget]:
    """One row per plan: an apply button and the plan in one line, near-ties of the best marked."""
    rows = []
    for plan in plans:
        apply = W.Button(description="apply", icon="check", layout=W.Layout(width="80px"))
        apply.on_click(lambda _b, plan=plan: apply_plan(plan))
        rows.append(W.HBox([apply, W.HTML(plan_html(plan, best=plan is plans[0]))]))
    return rows


_EMPTY = Estimate()
STALE = "stale (the controls are not valid): "
