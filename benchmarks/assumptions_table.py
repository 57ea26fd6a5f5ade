"""docs/assumptions.md, generated: every figure the estimate assumes, with its value, where it lives and its reason
or source as written at the line (the constant's or the field's docstring, a kernels.yaml comment).

    .venv/bin/python benchmarks/assumptions_table.py          # rewrite docs/assumptions.md
    .venv/bin/python benchmarks/assumptions_table.py --check  # exit 1 when it differs from the code

Each figure is classed by what its reason says: assumed, measured per machine by `toolkit calibrate`, fitted on
training runs, or sourced (a paper, a datasheet, a library's code). tests/test_readme_tables.py runs --check and
fails on a constant without a reason.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ESTIMATE = ROOT / "toolkit" / "estimate"
KERNELS = ROOT / "toolkit" / "data" / "kernels.yaml"
OUT = ROOT / "docs" / "assumptions.md"
DATACLASSES = {"hardware.py": "Assumptions", "device.py": "DeviceAssumptions"}
"""The dataclasses whose field defaults are assumptions (a catalog row's figures replace them)."""
NOT_ASSUMPTIONS = {
    "MIB",
    "GIB",
    "PF_DAY_FLOPS",
    "MONTH_S",
    "SCHEDULES",
    "BACKWARD_LAYERS",
    "AXES",
    "BAND_FILE",
    "KERNELS_FILE",
    "T",
    "INT64_BYTES",
}
"""Units, names and file paths: definitions, not figures."""


def kind(reason: str) -> str:
    text = reason.lower()
    if ("fitted" in text and "training run" in text) or "chosen once" in text:
        return "fitted on training runs"
    if "assumed" in text or "an assumption" in text:
        return "assumed"
    if "calibrate" in text:
        return "measured per machine (calibrate)"
    return "sourced"


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def documented(body: list[ast.stmt], source: str):
    """(name, value as written, docstring) of each assignment followed by a string, in `body`."""
    for stmt, after in zip(body, body[1:] + [None]):
        target = (
            stmt.targets[0]
            if isinstance(stmt, ast.Assign)
            else stmt.target
            if isinstance(stmt, ast.AnnAssign)
            else None
        )
        if not isinstance(target, ast.Name) or stmt.value is None:
            continue
        doc = (
            after.value.value
            if isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
            else None
        )
        yield target.id, ast.get_source_segment(source, stmt.value), doc


def code_rows() -> tuple[list[tuple], list[str]]:
    rows, missing = [], []
    for path in sorted(ESTIMATE.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        for name, value, doc in documented(tree.body, source):
            if name.isupper() and name not in NOT_ASSUMPTIONS and re.search(r"\d", value):
                rows.append((name, value, f"toolkit/estimate/{path.name}", doc))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == DATACLASSES.get(path.name):
                for name, value, doc in documented(node.body, source):
                    if re.search(r"\d", value):
                        rows.append((f"{node.name}.{name}", value, f"toolkit/estimate/{path.name}", doc))
    for name, _value, where, doc in rows:
        if not doc:
            missing.append(f"{where}: {name}")
    return rows, missing


def kernel_notes(lines: list[str]) -> dict[str, str]:
    """kernels.yaml's header: `# key[, key]: what it is and where it comes from`, continued on `#   ` lines."""
    notes, keys = {}, []
    for line in lines:
        start = re.match(r"# ([a-z_0-9]+(?:, [a-z_0-9]+)*): (.+)$", line)
        if start:
            keys = start.group(1).split(", ")
            for key in keys:
                notes[key] = start.group(2)
        elif line.startswith("#   ") and keys:
            for key in keys:
                notes[key] += " " + line[4:]
        else:
            keys = []
    return notes


def kernel_rows() -> list[tuple]:
    """kernels.yaml's scalar figures, per profile, with their line comment and the header's note on the key."""
    lines = KERNELS.read_text().splitlines()
    notes, rows, profile = kernel_notes(lines), [], ""
    for line in lines:
        name = re.match(r"\s*- name: (\S+)", line)
        if name:
            profile = name.group(1) + "."
            continue
        figure = re.match(r"\s*([a-z_0-9]+): ([-0-9.e]+)\s*(?:#\s*(.+))?$", line)
        note = next(
            (notes[k] for k in sorted(notes, key=len, reverse=True) if figure and figure.group(1).startswith(k)), None
        )
        if figure and note:
            reason = "; ".join(r for r in (figure.group(3), note) if r)
            rows.append((profile + figure.group(1), figure.group(2), "toolkit/data/kernels.yaml", reason))
    return rows


def table() -> tuple[str, list[str]]:
    rows, missing = code_rows()
    lines = [
        "# Assumptions",
        "",
        "Every figure the estimate assumes, generated by `benchmarks/assumptions_table.py` from the code and",
        "`toolkit/data/kernels.yaml` (do not edit by hand). A catalog row's own figures (`assumptions:`,",
        "`device_memory:`, measured by `toolkit calibrate`) replace the defaults for that device.",
        "",
        "| figure | value | where | kind | reason or source |",
        "|---|---|---|---|---|",
    ]
    for name, value, where, doc in rows + kernel_rows():
        reason = one_line(doc or "")
        lines.append(f"| `{name}` | `{one_line(value)}` | `{where}` | {kind(reason)} | {reason} |")
    return "\n".join(lines) + "\n", missing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text, missing = table()
    if missing:
        sys.exit("figures without a reason at the line: " + ", ".join(missing))
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            sys.exit("docs/assumptions.md differs from the code: run benchmarks/assumptions_table.py")
        return
    OUT.write_text(text)
    print(f"figures: {text.count(chr(10)) - 7}")


if __name__ == "__main__":
    main()
