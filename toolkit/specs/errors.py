"""One error type for every bad input, so the CLI and widgets can show it in one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["SpecError", "MeasurementFailed", "did_you_mean"]


class SpecError(ValueError):
    """A value the toolkit refuses: names the field, the value and what is allowed.

    `str(err)` is a single line such as
    ``parallel.tp = 3: must divide model.heads = 32; allowed: 1, 2, 4, 8, 16, 32``.
    """

    def __init__(self, field: str, value: object, problem: str):
        self.field = field
        self.value = value
        self.problem = problem
        shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        super().__init__(f"{field} = {shown}: {problem}" if field else problem)


class MeasurementFailed(RuntimeError):
    """A measurement that runs processes (a pipeline trace) lost one: says which, and its last error line."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choice, or '' when none is close."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=3, cutoff=0.6)
    if not close:
        # A prefix or a substring is also a good hint ('a100' -> 'A100-40GB', 'A100-80GB').
        close = [c for c in lowered if str(word).lower() in c][:3]
    if not close:
        return ""
    return " (did you mean " + " or ".join(lowered[c] for c in close) + "?)"
