"""The package boundaries docs/architecture.md draws, checked on the source (AST, imports inside functions
included): the layers below, no import cycle between modules, the runner and the tracer sharing the program and
never importing each other, no private name crossing a package, short functions, one mesh builder and one rank
launcher, and a map of the code that names every module there is."""

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


LAYERS = (
    ("specs",),
    ("estimate",),
    ("capability",),
    ("export", "runs"),
    ("plan", "views"),
    ("program", "launch"),
    ("checkpoint",),
    ("trace", "train", "serve"),
    ("calibrate",),
    ("cli",),
    ("widgets",),
)
"""The layer order, lowest first: a package imports only packages of lower layers (never one beside it). The first
seven layers up to views import no torch; program is the one program every rank runs; trace, train and serve
run it (each on its own); calibrate measures with them; the command line and the panels sit on top."""

TORCH_FREE = ("specs", "estimate", "capability", "export", "runs", "plan", "views")
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MODULES = {module_name(p) for p in SOURCES}


def short(package: str) -> str:
    return package.split(".", 1)[1] if package.startswith("toolkit.") else package


def our_module(module: str) -> str | None:
    """The module of ours an import names (a name imported from a package counts as that package), or None."""
    if not module.startswith(("toolkit", "widgets")):
        return None
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module if module in MODULES else None


def module_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (`from . import x` counts as module x)."""
    graph = {}
    for path in SOURCES:
        me = module_name(path)
        targets = set()
        for module, names in imports(path):
            for target in [module] + [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]:
                found = our_module(target)
                if found and found != me:
                    targets.add(found)
        graph[me] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_imports() -> dict[str, set[str]]:
    """package (short name) -> the packages of ours it imports."""
    out: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        mine = short(package_of(module))
        out.setdefault(mine, set()).update(
            short(package_of(t)) for t in targets if package_of(t) != package_of(module) and t != "toolkit"
        )
    return out


def test_every_package_has_a_layer():
    packages = {short(package_of(module_name(p))) for p in SOURCES} - {"toolkit", "toolkit.__init__"}
    assert packages - set(LAYER_OF) == set(), "add the new package to LAYERS"


def test_every_import_goes_down_the_layers():
    """No import against the contract, those inside functions included: a package imports only lower layers."""
    against = [
        f"{package} imports {other}"
        for package, others in package_imports().items()
        if package in LAYER_OF
        for other in sorted(others)
        if other in LAYER_OF and LAYER_OF[other] >= LAYER_OF[package]
    ]
    assert against == []


def test_no_import_cycle_between_modules():
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_torch_free_packages_import_no_torch():
    heavy = [
        f"{module_name(p)} imports {m}"
        for p in SOURCES
        if short(package_of(module_name(p))) in TORCH_FREE
        for m, _ in imports(p)
        if m.split(".")[0] in ("torch", "ipywidgets", "deepspeed", "accelerate")
    ]
    assert heavy == []


def test_each_package_says_what_it_owns_and_imports():
    """Each package's docstring ends with the line `Imports: a, b.` naming exactly the packages it imports."""
    wrong = []
    for package, others in package_imports().items():
        if package == "toolkit":
            continue
        folder = ROOT / (package if package == "widgets" else "toolkit/" + package)
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        said = re.search(r"Imports: (.*?)\.?$", doc.strip().splitlines()[-1] if doc.strip() else "")
        named = set(filter(None, re.split(r",\s*", said.group(1)))) - {"nothing of ours"} if said else None
        if named != others:
            wrong.append(f"{package}: says {sorted(named) if named is not None else None}, imports {sorted(others)}")
    assert wrong == []


def test_no_function_over_80_lines_nor_class_over_250():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.name} {lines}")
            if isinstance(node, ast.ClassDef) and lines > 250:
                long.append(f"{path.relative_to(ROOT)}:{node.name} {lines}")
    assert long == []


def test_one_mesh_builder_and_one_rank_launcher():
    """Device meshes are built in toolkit/program/mesh.py only; rank processes start in toolkit/launch/ranks.py only
    (the accelerate path starts accelerate's launcher, which starts the ranks; the panel starts `toolkit train`)."""
    places = {"init_device_mesh(": set(), "Popen(": set()}
    for path in SOURCES:
        text = path.read_text()
        for call in places:
            if call in text:
                places[call].add(str(path.relative_to(ROOT)))
    assert places["init_device_mesh("] == {"toolkit/program/mesh.py"}
    assert places["Popen("] == {"toolkit/launch/ranks.py", "toolkit/train/launch.py", "widgets/launcher.py"}


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
