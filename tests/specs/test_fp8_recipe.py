"""FP8 recipes as Megatron-Core names them (--fp8-recipe, or --fp8 RECIPE): MXFP8 only where the tensor cores scale
32-element blocks themselves (Blackwell, CDNA 4), refused elsewhere in one line naming the recipes that run."""

import json

import pytest

from toolkit.cli.main import main


@pytest.mark.parametrize("flags", [["--fp8", "mxfp8"], ["--fp8", "--fp8-recipe", "mxfp8"]])
def test_mxfp8_runs_on_blackwell(capsys, flags):
    assert (
        main(["estimate", "--model", "llama3-8b", "--gpus", "8xB200", "--precision", "mixed-bf16", *flags, "--json"])
        == 0
    )
    precision = json.loads(capsys.readouterr().out)["job"]["precision"]
    assert precision["fp8"] is True and precision["fp8_recipe"] == "mxfp8"


def test_mxfp8_on_hopper_is_refused_in_one_line(capsys):
    code = main(
        ["estimate", "--model", "llama3-8b", "--gpus", "8xH100-SXM", "--precision", "mixed-bf16", "--fp8", "mxfp8"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "tensorwise" in err


def test_no_fp8_still_turns_it_off(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "8xH100-SXM", "--no-fp8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["precision"]["fp8"] is False
