"""The README quotes the step-time accuracy from its results file, generated, never typed."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readmes_step_time_table_is_the_results_files():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readme_tables.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
