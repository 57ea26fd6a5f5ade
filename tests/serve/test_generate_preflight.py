"""`toolkit generate` refuses a job the host cannot hold in one line, before building anything (issue 53: llama2-7b
ran silently for 150 s to 11.8 GB before a timeout stopped it); train refuses the same way."""

from __future__ import annotations

from toolkit.cli.main import main


def test_a_model_the_host_cannot_hold_is_refused_in_one_line(tmp_path, capsys):
    # Llama-2-70B's fp32 weights alone are 69e9 x 4 bytes = 276 GB (Meta's model card: 69B parameters)
    code = main(["generate", "--model", "llama2-70b", "--precision", "fp32", "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "GiB of this host's memory" in err[0]
    assert not (tmp_path / "g").exists()  # nothing started, nothing written
