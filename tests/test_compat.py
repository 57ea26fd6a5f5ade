"""Upgrades: on a torch whose private internals moved, trace refuses in one line and training runs on unrecorded;
estimate never looks at them."""

import subprocess
import sys

import torch

from toolkit.program.compat import CHECKED, version_note

BLOCK = (
    "import sys; sys.modules['torch.distributed._tools.mem_tracker'] = None; "  # as if torch had moved it
    "from toolkit.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _toolkit_without_memtracker(*argv):
    return subprocess.run([sys.executable, "-c", BLOCK, *argv], capture_output=True, text=True, timeout=120)


def test_a_torch_without_the_internals_refuses_trace_in_one_line_and_still_estimates():
    traced = _toolkit_without_memtracker("trace", "--model", "gpt2", "--layers", "2", "--precision", "fp32")
    assert traced.returncode == 2 and traced.stdout == ""
    assert len(traced.stderr.strip().splitlines()) == 1, traced.stderr
    assert f"checked on torch {CHECKED['torch']}" in traced.stderr and "_tools.mem_tracker" in traced.stderr
    estimated = _toolkit_without_memtracker("estimate", "--model", "gpt2", "--gpus", "8xA100-80GB")
    assert estimated.returncode == 0 and "peak in a step" in estimated.stdout


def test_the_tested_version_is_said_only_when_it_differs():
    running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert (version_note() is None) == (running == CHECKED["torch"])
