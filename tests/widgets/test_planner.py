"""The planner panel, headless: set controls, click buttons, read the figures and messages it shows."""

import pytest

from toolkit.estimate import estimate
from toolkit.specs import Job
from widgets.planner import PlannerPanel

GIB = 2**30


@pytest.fixture
def panel():
    return PlannerPanel(preset="llama2-7b", accelerator="H100-SXM", count=8, precision="mixed-bf16", zero=3)


def _bar_total(fig):
    return sum(trace.x[0] for trace in fig.data)


def test_figures_show_the_estimate_of_the_controls(panel):
    expected = estimate(Job.from_dict(panel.job_data()))
    # the bar stacks the tensors up to their peak, then what the device holds beside them
    assert _bar_total(panel.memory_fig) == pytest.approx(expected["memory"]["device_peak_bytes"] / GIB)
    tensors = sum(t.x[0] for t in panel.memory_fig.data[:5])
    assert tensors == pytest.approx(expected["memory"]["peak_bytes"] / GIB)
    assert sum(t.x[0] for t in panel.step_fig.data) == pytest.approx(expected["time"]["step_s"])
    assert "fits" in panel.memory_fig.layout.title.text
    assert sorted(s.x0 for s in panel.memory_fig.layout.shapes) == pytest.approx(
        sorted([expected["memory"]["usable_bytes"] / GIB, expected["memory"]["device_bytes"] / GIB])
    )


def test_a_control_change_redraws(panel):
    before = _bar_total(panel.memory_fig)
    panel.controls["micro_batch"].value = 8
    assert _bar_total(panel.memory_fig) > before
    panel.controls["recompute"].value = "full"
    assert panel.job.memory.recompute == "full"
    assert "days" in panel.summary.value


def test_an_invalid_combination_is_shown_beside_its_control_not_raised(panel):
    shown = _bar_total(panel.memory_fig)
    panel.controls["tp"].value = 16  # 16 does not divide 8 devices
    assert "not valid (control: tp)" in panel.error.value and "parallel.tp = 16" in panel.error.value
    assert panel.controls["tp"].layout.border.startswith("2px solid")
    assert _bar_total(panel.memory_fig) == pytest.approx(shown)  # the last valid view stays up, marked stale
    assert panel.memory_fig.layout.title.text.startswith("stale") and panel.step_fig.layout.title.text.startswith(
        "stale"
    )
    panel.controls["tp"].value = 32  # a second invalid value: marked once, not twice
    assert panel.memory_fig.layout.title.text.count("stale") == 1
    panel.controls["tp"].value = 2
    assert panel.error.value == "" and panel.controls["tp"].layout.border is None
    assert not panel.memory_fig.layout.title.text.startswith("stale")


def test_suggest_lists_fixes_and_one_click_applies_one():
    panel = PlannerPanel(
        preset="llama2-70b", accelerator="H100-SXM", count=64, precision="mixed-bf16", tp=8, pp=4, zero=1, micro_batch=2
    )
    assert "over" in panel.memory_fig.layout.title.text
    fixes = panel.suggest()
    buttons = [b for b in panel.fixes_box.children if hasattr(b, "on_click")]
    assert fixes and buttons
    sp = next(b for b in buttons if b.description.startswith("sequence parallelism"))
    sp.click()
    assert panel.controls["sp"].value is True
    assert "fits" in panel.memory_fig.layout.title.text
    assert any("no change needed" in getattr(w, "value", "") for w in panel.fixes_box.children)  # it fits now


def test_fixes_compose_and_the_list_follows_the_job():
    """A second fix keeps the first (each applies only what it changes), the list is remade for the job a fix
    leaves, and changing the job by hand empties it."""
    panel = PlannerPanel(
        preset="llama2-70b", accelerator="H100-SXM", count=64, precision="mixed-bf16", tp=8, pp=4, zero=1, micro_batch=8
    )
    panel.suggest()
    sp = next(b for b in panel.fixes_box.children if getattr(b, "description", "").startswith("sequence parallelism"))
    sp.click()  # 126.3 GiB: still over
    labels = [b.description for b in panel.fixes_box.children if hasattr(b, "on_click")]
    assert labels and not any(label.startswith("sequence parallelism") for label in labels)
    smaller = next(b for b in panel.fixes_box.children if getattr(b, "description", "").startswith("micro-batch"))
    smaller.click()
    assert panel.controls["sp"].value is True and panel.controls["micro_batch"].value < 8  # composed, not undone
    assert panel.fixes_box.children
    panel.controls["recompute"].value = "selective"
    assert panel.fixes_box.children == ()


def test_export_writes_the_job_it_shows(panel, tmp_path):
    panel.export_path.value = str(tmp_path / "job.yaml")
    panel.export_button.click()
    again = Job.from_yaml(tmp_path / "job.yaml")
    assert estimate(again)["memory"]["peak_bytes"] == pytest.approx(panel.result.memory.peak_bytes)


def test_best_layouts_fill_a_table_and_a_pareto_plot():
    panel = PlannerPanel(
        preset="llama2-7b", accelerator="H100-SXM", count=16, precision="mixed-bf16", offer="p5.48xlarge"
    )
    result = panel.best_layouts()
    table = panel.best_box.children[0]
    assert result["plans"] and "layouts fit" in table.children[0].value
    pareto = panel.best_box.children[1]
    assert len(pareto.data[1].x) == len(result["pareto"])
    texts = [row.children[1].value for row in table.children[1:]]
    assert len(set(texts)) == len(texts)  # rows that differ say how


def test_a_best_layout_applies_with_one_click():
    """The applied layout's estimate is the plan's: the same device peak, to rounding."""
    panel = PlannerPanel(preset="llama2-7b", accelerator="H100-SXM", count=16, precision="amp-bf16")
    result = panel.best_layouts()
    plan = next(p for p in result["plans"] if p["layout"]["vpp"] == 1 and p["layout"]["cp"] == 1)
    row = panel.best_box.children[0].children[1 + result["plans"].index(plan)]
    row.children[0].click()
    for name in ("tp", "pp", "zero", "offload", "sp", "micro_batch", "recompute"):
        assert panel.controls[name].value == plan["layout"][name], name
    assert panel.result.memory.device_peak_bytes == pytest.approx(plan["device_peak_bytes"], rel=1e-9)


def test_every_label_fits_its_column_and_defaults_are_spelled_out(panel):
    """The 110 px labels hold about 15 characters (checkboxes put theirs beside the box); the fields where 0 means
    "the preset's" say so below the grid instead of in a label cut off at "sequence (0 = ..."."""
    import ipywidgets as W

    labelled = [c for c in panel.controls.values() if not isinstance(c, W.Checkbox)]
    assert all(len(c.description) <= 15 for c in labelled), [c.description for c in labelled]
    assert any("0 means the preset's own" in getattr(child, "value", "") for child in panel.children)


def test_the_panel_says_which_mfu_its_time_to_train_used(panel):
    """The same days as `toolkit estimate` for the same job, and whether the MFU was given or modelled."""
    from toolkit.estimate import estimate

    days = estimate(panel.job)["time"]["train_days"]
    assert f"{days:,.1f} days" in panel.summary.value and "modelled" in panel.summary.value


def test_offers_follow_the_chosen_accelerator(panel):
    """Only offers that carry the chosen accelerator are listed; a kept offer that no longer fits is dropped."""
    from toolkit.specs import load_catalog

    cat = load_catalog()
    panel.controls["accelerator"].value = "A100-80GB"
    listed = set(panel.controls["offer"].options) - {"none"}
    assert listed == {o.name for o in cat.offers.values() if cat.accelerator(o.accelerator).name == "A100-80GB"}
    panel.controls["offer"].value = "p4de.24xlarge"
    panel.controls["accelerator"].value = "H100-SXM"
    assert panel.controls["offer"].value == "none" and "p5.48xlarge" in panel.controls["offer"].options
    assert panel.error.value == ""  # no mismatched offer was ever estimated


def test_before_run_the_panel_says_in_words_what_run_will_start():
    from toolkit.runs.proxy import LocalDevices

    panel = PlannerPanel(
        preset="llama2-7b", accelerator="H100-SXM", count=8, precision="amp-bf16", zero=3, here=LocalDevices("cpu", 2)
    )
    note = panel.run_note.value
    assert "no GPU here" in note and "proxy on 2 rank(s)" in note and "Kept: dp 2, ZeRO-3, fp32" in note
    assert "precision amp-bf16 → fp32" in note  # a CPU's 16-bit autocast runs 20-30x slower: said, not hidden
    assert "32 layers, hidden 4096" in note and not panel.run_button.disabled
    panel.controls["pp"].value = 2  # FSDP2 stages over dp: run
    assert not panel.run_button.disabled
    panel.controls["offload"].value = "params"  # FSDP2's offload under pipelines: run
    assert not panel.run_button.disabled
    panel.controls["precision"].value = "mixed-bf16"  # Megatron's program: the proxy trains amp
    panel.controls["pp"].value = 1  # ZeRO-Infinity: estimated, not run
    assert panel.run_button.disabled and "not available here" in panel.run_note.value
    assert panel.run() is None  # the button is off, and so is the call
    panel.controls["tp"].value = 16  # not valid at all
    assert panel.run_button.disabled and "not valid" in panel.run_note.value
    on_gpus = PlannerPanel(
        preset="llama2-7b",
        accelerator="H100-SXM",
        count=8,
        precision="amp-bf16",
        zero=3,
        here=LocalDevices("cuda", 8, 80 * 2**30, "H100"),
    )
    assert "the job itself, on 8 rank(s)" in on_gpus.run_note.value and on_gpus.run_steps.disabled


def test_the_state_a_reloaded_tab_asks_for_stays_small(panel):
    """A reloaded tab asks the kernel for every widget's state at once and gives the reply 4 s (ipywidgets'
    `request_states`); with plotly's 5 MB page code in each figure's state it passed 15 MB and, on a loaded machine,
    came too late ("model not found"). Measured as ipywidgets serializes it: the figures' page code is a loader
    of a few KB, and the bundle it fetches once is plotly's own."""
    import json

    from ipywidgets.widgets.widget import _remove_buffers

    state_bytes = 0
    for widget in [panel, panel.memory_fig, panel.step_fig, *panel.children]:
        state, _paths, buffers = _remove_buffers(widget.get_state())
        state_bytes += len(json.dumps(state, default=str)) + sum(len(b) for b in buffers)
    assert state_bytes < 200_000
    sent = []
    panel.memory_fig.send = lambda content, buffers=None: sent.append((content, buffers))
    panel.memory_fig._handle_custom_msg(
        {"id": "1", "kind": "anywidget-command", "name": "_plotly_bundle", "msg": None}, []
    )
    ((content, buffers),) = sent
    assert content["id"] == "1" and len(buffers[0]) > 1_000_000 and b"FigureView" in buffers[0]


def test_a_job_that_fits_nowhere_says_so_and_run_says_it_trains_only_a_proxy():
    """Llama 3 405B on one RTX 4090 (24 GiB): no layout fits, the panel says the job cannot run as planned, and Run
    says what it offers is a proxy of a job that does not fit its devices."""
    panel = PlannerPanel(preset="llama3-405b", accelerator="RTX-4090", count=1)
    assert not panel.result.memory.fits
    note = panel.run_note.value
    assert "does not fit its devices" in note and "proxy" in note and "not this job" in note
    result = panel.best_layouts()
    assert result["fitting"] == 0
    assert "No layout fits" in panel.best_box.children[0].children[0].value
