"""A new user's path through 00_start_here in a real browser (JupyterLab, headless Chromium via Playwright):
the cells up to the planner run and the panel renders; a control change redraws its figure; Run trains the
proxy and its chart updates live; Stop leaves a checkpoint and no process; Resume continues from it; a
reload of the saved tab still shows every chart. Screenshots go to test-artifacts/ (kept by CI). `make test`
installs Chromium when it is missing. The redraw latency in the browser is benchmarks/browser_latency.py, not a test."""

import json
import re
import time

import pytest
from playwright.sync_api import sync_playwright

from tests.browser.jupyter_lab import (
    REPO,
    jupyter_lab,
    kill_processes_under,
    launch_chromium,
    open_notebook,
    processes_under,
    run_through,
    wait_idle,
)

ARTIFACTS = REPO / "test-artifacts"
NOTEBOOK = REPO / "notebooks" / "00_start_here.ipynb"
PANEL_CELL = "panel = PlannerPanel("
STEPS = 400  # long enough to stop mid-run; the test stops it twice and never waits for the end

_DATA = "gd => JSON.stringify(gd.data.map(t => [t.x, t.y]))"
_LOSS_POINTS = "gd => (gd.data && gd.data[0] && gd.data[0].x) ? gd.data[0].x.length : 0"


def _panel(page):
    return page.locator(".jp-Cell", has_text=PANEL_CELL).first.locator(".jp-OutputArea")


def _exactly(label):
    """A button's own text (its accessible name also holds the icon font's glyph)."""
    return re.compile(rf"^\s*{label}\s*$")


def _steps(run_dir):
    return [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def page(tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyter_lab(tmp_path, [NOTEBOOK], clear_outputs=True) as (base, token), sync_playwright() as p:
        browser = launch_chromium(p)
        page = open_notebook(browser, base, token, NOTEBOOK.name)
        page.root = tmp_path
        console = []  # the page's console, kept beside the screenshots
        page.on("console", lambda message: console.append(f"{time.monotonic():.1f} {message.type}: {message.text}"))
        try:
            yield page
        finally:
            (ARTIFACTS / "jupyterlab_console.log").write_text("\n".join(console) + "\n")
            browser.close()
            kill_processes_under(tmp_path)  # (a failed test's run outlives the kernel: stop it)


def test_plan_run_stop_resume_and_reload_in_the_browser(page):
    try:
        _plan_run_stop_resume_reload(page)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_failure.png"))  # what the browser showed
        raise


def _plan_run_stop_resume_reload(page):
    root = page.root
    run_through(page, PANEL_CELL)  # the cells up to the planner (nbval runs the notebook's own run)
    panel = _panel(page)
    panel.get_by_role("button", name="suggest fixes").wait_for(timeout=240_000)
    panel.get_by_text("Run trains a proxy on 2 rank(s)").wait_for(timeout=30_000)  # said before Run
    memory = panel.locator(".js-plotly-plot").first
    memory.wait_for(timeout=60_000)
    assert memory.locator(".bars .point").count() >= 4  # the stacked memory bar drew its parts

    # 1. a control change redraws the figure (the estimate of the new job, drawn by plotly in the page)
    before = memory.evaluate(_DATA)
    panel.locator(".widget-dropdown", has_text="recompute").locator("select").select_option("full")
    page.wait_for_function(
        "([gd, old]) => JSON.stringify(gd.data.map(t => [t.x, t.y])) !== old",
        arg=[memory.element_handle(), before],
        timeout=30_000,
    )

    # 2. Run: the proxy trains and the launcher's chart updates live, at least three times
    steps = panel.locator(".widget-text", has_text="steps").locator("input")
    steps.fill(str(STEPS))
    steps.press("Enter")
    panel.locator("button", has_text=_exactly("Run")).click()
    run_dir = root / "runs" / "start_here"
    live = panel.locator(".js-plotly-plot").last
    live.wait_for(timeout=60_000)
    seen = set()
    _wait_for(lambda: seen.add(live.evaluate(_LOSS_POINTS)) or len(seen - {0}) >= 3, 180, "three live updates")
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_run_live.png"))

    # 3. Stop: every rank checkpoints and exits; no process is left
    panel.locator("button", has_text=_exactly("Stop")).click()
    stopped = panel.get_by_text(re.compile(r"stopped cleanly at step \d+"))
    stopped.wait_for(timeout=120_000)
    at = int(re.search(r"step (\d+)", stopped.inner_text()).group(1))
    assert 0 < at < STEPS and (run_dir / "checkpoints" / f"step_{at:08d}.pt").exists()
    assert processes_under(root) == []

    # 4. Resume continues from that checkpoint (step at + 1 follows, nothing is retrained), then stop again
    panel.locator("button", has_text=_exactly("Resume")).click()
    _wait_for(lambda: max(_steps(run_dir)) >= at + 2, 180, "steps after the resume")
    panel.locator("button", has_text=_exactly("Stop")).click()
    panel.get_by_text(re.compile(rf"stopped cleanly at step (?!{at}\b)\d+")).wait_for(timeout=120_000)
    steps_run = _steps(run_dir)
    assert steps_run == list(range(1, max(steps_run) + 1))  # one record a step: resumed, not restarted
    log = (run_dir / "launcher.log").read_text()  # the stop and the resume, both kept
    assert f"stopped by SIGTERM after step {at};" in log and f"resumed from step_{at:08d}.pt (step {at})" in log
    assert processes_under(root) == []
    _wait_for(lambda: live.evaluate(_LOSS_POINTS) == len(steps_run), 30, "the chart to show every step")

    # 5. a reload of the saved tab still shows the charts (the kernel and its widgets live on). JupyterLab draws
    # widgets only in a trusted notebook: one whose every output this browser made (here: the stored outputs
    # were cleared, as after Edit > Clear Outputs of All Cells, or Run All), else the panel's one-line stand-in
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    page.wait_for_selector(".jp-mod-dirty", state="detached", timeout=30_000)
    page.reload()
    wait_idle(page)
    panel = _panel(page)
    panel.scroll_into_view_if_needed()
    panel.locator("button", has_text=_exactly("Resume")).wait_for(timeout=60_000)
    live = panel.locator(".js-plotly-plot").last
    _wait_for(lambda: live.count() and live.evaluate(_LOSS_POINTS) == len(steps_run), 60, "the chart after reload")
    assert panel.locator(".js-plotly-plot").count() >= 3  # memory, step time and the run
    live.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_after_reload.png"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert "Traceback" not in " ".join(errors.all_inner_texts())
