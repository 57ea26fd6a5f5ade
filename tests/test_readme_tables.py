"""The docs quote figures from their sources, generated, never typed: the README's step-time table and
docs/accuracy.md from benchmarks/results/*.json, docs/assumptions.md from the code's own constants."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["readme_tables.py", "assumptions_table.py"])
def test_the_generated_docs_are_their_sources(script):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
