"""Execute the tutorials in place and keep them small enough to commit.

    .venv/bin/python notebooks/refresh.py [NOTEBOOK ...]

Runs each notebook top to bottom (as nbval will), then drops the saved widget state (a
FigureWidget's state embeds plotly.js: megabytes) and reports each file's size. Cells marked
`# NBVAL_IGNORE_OUTPUT` (widgets, timings) keep their outputs for reading on GitHub but are
not compared by the tests.
"""
import subprocess
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


def refresh(path: Path) -> int:
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                    str(path)], check=True, cwd=HERE.parent)
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET in data:       # without the dropped state the view cannot draw, and the repr would show instead
                data["text/plain"] = PLACEHOLDER
    nbformat.write(nb, path)
    return path.stat().st_size


WIDGET = "application/vnd.jupyter.widget-view+json"
PLACEHOLDER = "(an interactive panel: run this cell to show it)"


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(HERE.glob("[0-9]*.ipynb"))
    for path in paths:
        print(f"{path.name}: {refresh(path) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
