"""JupyterLab on localhost and headless Chromium (Debian's) driven by Playwright, for the browser tests and for
benchmarks/browser_latency.py. The notebook is served from a scratch folder, so saving it there (as the
reload test does) never touches the repository's copy, and its runs land there too."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root: Path, notebooks: list[Path], clear_outputs: bool = False):
    """Serve `root` (the notebooks copied into it, their stored outputs cleared if asked) on a free port; yields
    (base URL, token)."""
    root.mkdir(parents=True, exist_ok=True)
    for notebook in notebooks:
        shutil.copy(notebook, root / notebook.name)
        if clear_outputs:
            import nbformat

            nb = nbformat.read(root / notebook.name, as_version=4)
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
            nbformat.write(nb, root / notebook.name)
    port, token = _free_port(), secrets.token_hex(12)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(root / ".config"), JUPYTER_RUNTIME_DIR=str(root / ".rt"))
    log = root / "lab.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--ServerApp.token={token}",
            f"--ServerApp.root_dir={root}",
            "--allow-root",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=root,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
    try:
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)


def open_notebook(browser, base: str, token: str, name: str):
    """A page with the notebook open and its kernel idle (the kernel session is made through the REST API, as the
    UI would; JupyterLab's "Select Kernel" dialog, which it sometimes raises anyway, is answered)."""
    body = json.dumps({"path": name, "name": name, "type": "notebook", "kernel": {"name": "python3"}})
    request = urllib.request.Request(
        f"{base}/api/sessions?token={token}",
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["kernel"]["id"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    wait_idle(page)
    return page


def wait_idle(page, timeout_ms: int = 60_000) -> None:
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_ms)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout_ms)
    with contextlib.suppress(PlaywrightTimeout):
        page.get_by_role("button", name="Select", exact=True).click(timeout=3_000)


def run_menu(page, item: str) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text(item, exact=True).click()


def run_through(page, cell_text: str) -> None:
    """Run every cell up to and including the code cell that contains `cell_text` (JupyterLab's "Run All Above
    Selected Cell", with the cell after it selected)."""
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=cell_text).first
    cell.locator("xpath=following-sibling::div[contains(@class,'jp-Cell')][1]").click()
    run_menu(page, "Run All Above Selected Cell")


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def processes_under(root: Path) -> list[str]:
    """Command lines of the toolkit's processes (launcher, ranks) whose working folder is under `root`."""
    return [args for _pid, args in _toolkit_processes(root)]


def kill_processes_under(root: Path) -> None:
    for pid, _args in _toolkit_processes(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _toolkit_processes(root: Path) -> list[tuple[int, str]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cwd.startswith(str(root)) and "toolkit" in args and "jupyter" not in args and "ipykernel" not in args:
            found.append((int(proc.name), args))
    return found
