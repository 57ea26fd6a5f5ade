"""Where a benchmark's figures came from: the date, the commit and the machine, written into every
benchmarks/results/*.json so that docs quoting them say when and where they were measured."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def provenance() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit or "unknown",
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
