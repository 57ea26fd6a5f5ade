"""Without a GPU a run whose precision nobody chose trains in fp32 (bf16 autocast is 20-30x slower on a CPU),
says so in one line, and a chosen precision is kept."""

import contextlib
import io

import torch

from toolkit.cli import main
from toolkit.specs import Job

from .test_runner import FLAGS

NO_PRECISION = [f for i, f in enumerate(FLAGS) if f != "--precision" and (i == 0 or FLAGS[i - 1] != "--precision")]


def _train(out, *extra) -> tuple[int, str]:
    """(exit code, what it printed): the note goes to stdout, so that a refusal stays one line on stderr."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = main(["train", *NO_PRECISION, "--steps", "2", "--out", str(out), *extra])
    return code, said.getvalue()


def test_a_cpu_run_defaults_to_fp32_and_says_so(tmp_path):
    if torch.cuda.is_available():  # (the default stays the job's on a GPU)
        return
    code, err = _train(tmp_path / "default")
    assert code == 0 and "no GPU here: precision fp32" in err and "--precision amp-bf16 to run" in err, err
    assert Job.from_yaml(tmp_path / "default" / "job.yaml").precision.mode == "fp32"
    code, err = _train(tmp_path / "chosen", "--precision", "pure-bf16")
    assert code == 0 and "no GPU here" not in err, err
    assert Job.from_yaml(tmp_path / "chosen" / "job.yaml").precision.mode == "pure-bf16"
