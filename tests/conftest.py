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
