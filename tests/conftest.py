"""Shared fixtures: the built-in catalog and a helper that runs the CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.specs import load_catalog

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture
def cli(capsys):
    """cli('estimate', '--model', 'gpt2') -> (exit code, stdout, stderr)."""

    def run(*argv: str):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli_json(cli):
    def run(*argv: str) -> dict:
        code, out, err = cli(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    return run


# The files that take longest (real ranks in subprocesses, notebooks that train, the browser) go first, so that
# `make test`'s two workers, which take whole files in this order (xdist --dist loadfile --no-loadscope-reorder),
# end together instead of one finishing a long file alone (xdist's own order puts files with many tests first).
SLOW_FIRST = (
    "tests/train/test_layouts.py",
    "tests/train/test_runner.py",
    "tests/train/test_deepspeed_backend.py",
    "tests/trace/test_zero.py",
    "notebooks/00_start_here.ipynb",
    "notebooks/06_parallelism.ipynb",
    "tests/browser/test_jupyterlab.py",
    "notebooks/03_mixed_precision.ipynb",
    "notebooks/01_memory.ipynb",
    "tests/test_properties.py",
    "tests/train/test_checkpoint.py",
    "tests/train/test_capability.py",
    "tests/widgets/test_launcher.py",
    "tests/trace/test_int8.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # (stable: files stay whole)
