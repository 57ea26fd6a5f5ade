"""The gate on predictions: every estimate of benchmarks/predictions.py's fixed grid (dense, MoE, serving; each
accelerator family; each layout axis) equals what benchmarks/results/predictions.json keeps. A change that moves
one regenerates the file (`.venv/bin/python benchmarks/predictions.py`, which prints the moves largest first) and
says why in CHANGELOG.md."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_prediction_moved_without_the_file_being_regenerated():
    check = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "predictions.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert "predictions: " in check.stdout and int(check.stdout.split("predictions: ")[1].split()[0]) > 1000
