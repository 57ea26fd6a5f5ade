"""Every job flag's --help says what it does (its field's docstring), not only the YAML key it sets (issue 53)."""

from __future__ import annotations

from toolkit.cli.field_help import _docstrings
from toolkit.cli.job_flags import OVERRIDES, TRAIN_OVERRIDES
from toolkit.cli.main import build_parser


def test_every_job_flag_has_a_sentence_of_help():
    bare = [flag for flag, (_s, fld, cls) in {**OVERRIDES, **TRAIN_OVERRIDES}.items() if fld not in _docstrings(cls)]
    assert bare == []


def test_the_help_names_the_unit_and_the_key():
    text = build_parser()._subparsers._group_actions[0].choices["estimate"].format_help()
    assert "[serving.rate]" in text and "Requests arriving a second" in text
    assert "tokens [model.seq_len]" in text
