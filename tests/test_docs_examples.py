"""Every console example in the README and docs/ whose command runs without torch (estimate, plan, doctor, catalog,
pipeline, claims) is run here, and each output line it quotes must be in today's output: an example cannot drift
from what the toolkit prints. A quoted line cut with "..." is compared up to the cut."""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest

from toolkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
RUN_HERE = ("estimate", "plan", "doctor", "catalog", "pipeline", "claims")
"""Commands cheap enough to run in a test; train, calibrate and compare examples are checked by their own tests."""


def examples() -> list[tuple[str, str, list[str]]]:
    """(where, command, the output lines shown) of every `$ toolkit ...` in a console block."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        inside = False
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                inside = line.strip() == "```console" and not inside
                continue
            if inside and line.startswith("$ "):
                command, j = line[2:], number
                while command.endswith("\\"):
                    command, j = command[:-1] + lines[j].strip(), j + 1
                shown = []
                for out in lines[j:]:
                    if out.startswith(("$ ", "```")):
                        break
                    shown.append(out)
                found.append((f"{path.name}:{number}", command, shown))
    return found


def runnable(command: str) -> bool:
    words = shlex.split(command)
    return bool(words) and words[0].endswith("toolkit") and words[1] in RUN_HERE and "$(" not in command


EXAMPLES = [e for e in examples() if runnable(e[1])]


def test_the_docs_have_examples_to_check():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("where, command, shown", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_an_example_prints_what_the_docs_show(where, command, shown):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(shlex.split(command)[1:])
    assert code in (0, 1), f"{where}: {command} exited {code}"
    printed = [line.rstrip() for line in out.getvalue().splitlines()]
    for line in shown:
        quoted = line.rstrip()
        if not quoted.strip() or quoted.strip() in ("...", "…"):
            continue
        if "..." in quoted:
            head = quoted.split("...")[0].rstrip()
            assert any(p.startswith(head) for p in printed), f"{where}: no line starts with {head!r}"
        else:
            assert quoted in printed, f"{where}: {quoted!r} is not in today's output"
