"""The registry of layout axes (toolkit.specs.axes) walked front end by front end: the grid, the search, the CLI,
the planner panel, the text report, the proxy, the device groups and the runner's mesh each take every axis. A
front end that loses an axis fails here, naming the axis."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.specs import Job, load_catalog
from toolkit.specs.axes import AXES, MESH_ORDER, data_parallel, model_parallel

CATALOG = load_catalog()
BASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"accelerator": "H100-SXM", "count": 64},
    "precision": {"mode": "amp-bf16"},
}
NON_DEFAULT = {
    "tp": 2,
    "pp": 2,
    "vpp": 2,
    "cp": 2,
    "sp": True,
    "zero": 3,
    "dp_replicate": 2,
    "ep": 2,
    "etp": 2,
    "offload": "params",
    "micro_batch": 2,
    "recompute": "full",
}
"""A value other than the default for each axis, one that a 64-GPU Llama-2-7B job allows (ep: Mixtral-8x7B's)."""
MODEL_FOR = {"ep": "mixtral-8x7b", "etp": "mixtral-8x7b"}
"""An axis that needs another model than BASE's: expert parallelism needs experts."""


def test_every_axis_has_a_non_default_value_here():
    assert set(NON_DEFAULT) == {axis.name for axis in AXES}


def job_with(name: str, value) -> Job:
    """The base job with one axis set (and what it needs: vpp needs pp, sp needs tp, HSDP and offload need ZeRO)."""
    needs = {"vpp": {"pp": 2}, "sp": {"tp": 2}, "dp_replicate": {"zero": 3}, "offload": {"zero": 3}}.get(name, {})
    data = {k: dict(v) for k, v in BASE.items()}
    data["model"] = {"preset": MODEL_FOR.get(name, "llama2-7b")}
    section = {axis.name: axis.section for axis in AXES}
    for field, v in {**needs, name: value}.items():
        data.setdefault(section[field], {})[field] = v
    return Job.from_dict(data, CATALOG).resolve(CATALOG)[0]


@pytest.mark.parametrize("axis", AXES, ids=lambda a: a.name)
def test_the_grid_and_the_search_vary_it(axis):
    from toolkit.estimate.grid import AXES as GRID_AXES
    from toolkit.estimate.grid import layout_grid
    from toolkit.plan.search import AXIS_VALUES

    assert GRID_AXES.get(axis.name) == axis.section
    assert AXIS_VALUES.get(axis.name), f"the planner's search does not try {axis.name}"
    base = job_with("zero", 3) if axis.name == "dp_replicate" else job_with("tp", 1)
    if axis.name in MODEL_FOR:
        base = job_with(axis.name, axis.default)
    grid = layout_grid(base, **{axis.name: [axis.default, NON_DEFAULT[axis.name]]})
    assert [grid.layout(i)[axis.name] for i in range(2)] == [axis.default, NON_DEFAULT[axis.name]]


@pytest.mark.parametrize("axis", AXES, ids=lambda a: a.name)
def test_the_cli_takes_its_flag_and_the_search_keeps_it_fixed(axis, tmp_path):
    from toolkit.cli.job_flags import fixed_axes, job_from_args
    from toolkit.cli.main import build_parser

    flag_value = {True: [], "params": ["params"], "full": ["full"]}.get(
        NON_DEFAULT[axis.name], [str(NON_DEFAULT[axis.name])]
    )
    model = MODEL_FOR.get(axis.name, "llama2-7b")
    args = build_parser().parse_args(["estimate", "--model", model, axis.flag, *flag_value])
    assert axis.name in fixed_axes(args)
    job = job_from_args(args, CATALOG)
    assert getattr(getattr(job, axis.section), axis.name) == NON_DEFAULT[axis.name]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"model: {{preset: {model}}}\n{axis.section}: {{{axis.name}: {NON_DEFAULT[axis.name]}}}\n")
    from_file = build_parser().parse_args(["plan", "--config", str(job_file)])
    assert axis.name in fixed_axes(from_file)


@pytest.mark.parametrize("axis", AXES, ids=lambda a: a.name)
def test_the_text_report_shows_it(axis):
    from toolkit.views.text import layout_text

    plain = {"dp": 8, **{a.name: a.default for a in AXES}}
    assert layout_text({**plain, axis.name: NON_DEFAULT[axis.name]}) != layout_text(plain)


@pytest.mark.parametrize("axis", AXES, ids=lambda a: a.name)
def test_the_planner_panel_has_a_control_that_reaches_the_job(axis):
    panel = _panel()
    assert axis.name in panel.controls, f"the planner panel has no control for {axis.name}"
    assert panel.job_data()[axis.section][axis.name] == axis.default
    panel.set_job({axis.section: {axis.name: NON_DEFAULT[axis.name]}})
    assert panel.job_data()[axis.section][axis.name] == NON_DEFAULT[axis.name]


_PANEL = []


def _panel():
    if not _PANEL:
        from widgets.planner import PlannerPanel

        _PANEL.append(PlannerPanel(preset="llama2-7b", accelerator="H100-SXM", count=64))
    return _PANEL[0]


@pytest.mark.parametrize("axis", AXES, ids=lambda a: a.name)
def test_the_proxy_takes_it_within_what_this_machine_runs(axis):
    from toolkit.runs.proxy import LocalDevices, run_plan

    job = job_with(axis.name, NON_DEFAULT[axis.name])
    plan = run_plan(job, LocalDevices("cpu", 2), max_ranks=4)
    assert plan.job is not None, plan.refusal
    value = getattr(getattr(plan.job, axis.section), axis.name)
    kept = NON_DEFAULT[axis.name] if axis.proxy_max is None else min(NON_DEFAULT[axis.name], axis.proxy_max)
    if axis.name == "sp":
        kept = plan.job.parallel.tp > 1  # sequence parallelism goes where tensor parallelism does
    assert value == kept
    if value != NON_DEFAULT[axis.name] and axis.section == "parallel":
        assert any(c.startswith(f"{axis.name} ") for c in plan.changes), plan.changes


@pytest.mark.parametrize("axis", [a for a in AXES if a.splits_devices], ids=lambda a: a.name)
def test_the_device_groups_and_the_mesh_count_each_dimension(axis):
    from toolkit.estimate.device import comm_groups

    plain = job_with("tp", 1)
    split = job_with(axis.name, NON_DEFAULT[axis.name])
    assert comm_groups(split) != comm_groups(plain)
    assert axis.name in MESH_ORDER
    assert model_parallel(split.parallel) * split.parallel.dp == split.cluster.count


def test_the_dp_rule_on_arrays_is_the_rule_on_each_layout():
    from types import SimpleNamespace

    tp, pp, cp = np.array([1, 2, 8]), np.array([1, 4, 2]), np.array([1, 1, 2])
    par = SimpleNamespace(tp=tp, pp=pp, cp=cp)
    assert data_parallel(64, par).tolist() == [64, 8, 2]
    assert data_parallel(4, SimpleNamespace(tp=8, pp=1, cp=1)) == 1


def test_the_runner_builds_its_mesh_in_the_registry_order():
    from toolkit.specs.axes import mesh_dims

    assert mesh_dims({"tp": 2, "dp": 4, "pp": 3}) == (("pp", "dp", "tp"), (3, 4, 2))
    assert mesh_dims({"tp": 2, "dp_shard": 2, "dp_replicate": 2}) == (("dp_replicate", "dp_shard", "tp"), (2, 2, 2))
    assert mesh_dims({"tp": 2, "ep": 4, "edp": 2, "pp": 2}) == (("pp", "edp", "ep", "tp"), (2, 2, 4, 2))


def test_a_flag_the_registry_lacks_is_not_a_layout_axis():
    """The parser's own layout flags are the registry's, plus dp (which the dp rule derives)."""
    from toolkit.cli.job_flags import OVERRIDES

    parallel_flags = {flag for flag, (section, _f, _c) in OVERRIDES.items() if section == "parallel"}
    assert {a.name for a in AXES if a.section == "parallel"} <= parallel_flags
