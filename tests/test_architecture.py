"""The package boundaries docs/architecture.md draws, checked on the source (AST, lazy imports included): the
runner and the tracer share the program and never import each other, no private name crosses a package, and the
map of the code names every module there is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for top in ("toolkit", "widgets") for p in (ROOT / top).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """(imported module, [names]) for every import in the file, relative ones resolved."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [a.name for a in node.names]


def package_of(module: str) -> str:
    """toolkit.X for a module inside toolkit (a top-level module is its own package), widgets for the widgets."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "toolkit" else parts[0]


def test_the_runner_and_the_tracer_never_import_each_other():
    crossings = [
        f"{module_name(p)} imports {m}"
        for p in SOURCES
        for m, _ in imports(p)
        if {package_of(module_name(p)), package_of(m)} == {"toolkit.train", "toolkit.trace"}
    ]
    assert crossings == []


def test_no_private_name_crosses_a_package():
    crossings = [
        f"{module_name(p)}: from {m} import {n}"
        for p in SOURCES
        for m, names in imports(p)
        if m.startswith(("toolkit", "widgets")) and package_of(m) != package_of(module_name(p))
        for n in names
        if n.startswith("_")
    ]
    assert crossings == []


def test_no_loose_calibrate_or_cli_modules():
    loose = [p.name for p in (ROOT / "toolkit").glob("*.py") if re.match(r"(calibrate|cli)(_\w+)?\.py$", p.name)]
    assert loose == []


def test_the_map_of_the_code_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p.name not in ("__init__.py", "__main__.py") and str(p.relative_to(ROOT)) not in text
    ]
    assert missing == [], f"docs/architecture.md does not name {missing}"


def test_no_benchmark_or_test_reads_outside_the_repository():
    """A clone reproduces every figure: no path literal climbs out of the repository (a relative path that starts
    with or passes through a parent folder); docstrings may still cite a source beside the repository."""
    up = ".." + "/"
    outside = []
    for path in sorted(p for top in ("benchmarks", "tests", "toolkit", "widgets") for p in (ROOT / top).rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and (node.value.startswith(up) or "/" + up in node.value)
            ):
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert outside == []
