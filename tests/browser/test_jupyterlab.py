"""A real browser: JupyterLab on localhost, headless Chromium (Debian's) driven by Playwright.

Opens notebooks/00_start_here.ipynb, runs every cell, and checks that the planner panel (an
ipywidgets panel with plotly FigureWidgets) and the run's plotly chart render. The screenshot is
kept in test-artifacts/ for people to look at. `make test` installs Chromium when it is missing.
"""
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    port, token = _free_port(), secrets.token_hex(12)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={REPO}", "--allow-root",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=REPO, env=env, stdout=open(tmp_path / "lab.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "lab.log").read_text()
            time.sleep(0.3)
    try:
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)


def _create_session(base: str, token: str, path: str) -> dict:
    """A kernel attached to the notebook through the server's REST API, as the UI would."""
    body = json.dumps({"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}})
    request = urllib.request.Request(f"{base}/api/sessions?token={token}", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())



def run_all_cells(page) -> None:
    """Run All; first answer JupyterLab's "Select Kernel" dialog, which it sometimes raises although the
    session already has a kernel (it blocked Run All once in CI)."""
    try:
        page.get_by_role("button", name="Select", exact=True).click(timeout=5_000)
    except PlaywrightTimeout:
        pass
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()

def test_start_here_renders_the_planner_panel_and_a_chart(lab):
    base, token = lab
    session = _create_session(base, token, "notebooks/00_start_here.ipynb")
    assert session["kernel"]["id"]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{base}/lab/tree/notebooks/00_start_here.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            run_all_cells(page)
            first_done = page.locator(".jp-InputArea-prompt", has_text="[1]").first
            try:
                first_done.wait_for(timeout=90_000)
            except PlaywrightTimeout:      # a kernel dialog raised after the first click: once more
                run_all_cells(page)
                first_done.wait_for(timeout=90_000)
            page.get_by_role("button", name="suggest fixes").wait_for(timeout=240_000)      # the planner panel
            panel_plot = page.locator(".jp-OutputArea .js-plotly-plot").first
            panel_plot.wait_for(timeout=60_000)                                             # its FigureWidget
            page.get_by_text("steps on 2 rank(s)").wait_for(timeout=180_000)                # the real run finished
            page.wait_for_function("document.querySelectorAll('.jp-OutputArea .js-plotly-plot').length >= 3",
                                   timeout=60_000)                                          # the metrics chart too
            page.get_by_role("button", name="suggest fixes").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "jupyterlab_start_here.png"))
            bars = page.locator(".jp-OutputArea .js-plotly-plot").first.locator(".bars .point")
            assert bars.count() >= 4                      # the stacked memory bar drew its parts
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert "Traceback" not in " ".join(errors.all_inner_texts())
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "jupyterlab_failure.png"))   # what the browser showed
            raise
        browser.close()
