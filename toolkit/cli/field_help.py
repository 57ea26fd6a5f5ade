"""What a job flag's --help says: the first sentence of its field's docstring in the spec classes (the same text
the YAML keys are documented with), then the key it sets, so help and docs cannot part."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache

__all__ = ["field_help"]

HELP_CHARS = 150
"""Longest help text kept of a docstring (argparse wraps it; a whole paragraph buries the flag list)."""


@cache
def _docstrings(cls: type) -> dict[str, str]:
    """Each field of a dataclass and the string literal that follows its annotation in the class body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for stmt, after in zip(body, body[1:]):
        is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            docs[stmt.target.id] = " ".join(str(after.value.value).split())
    return docs


def _first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence, cut to HELP_CHARS."""
    for i, ch in enumerate(text):
        if ch == "." and (i + 1 == len(text) or text[i + 1] == " ") and not text[max(i - 2, 0) : i].endswith("e.g"):
            text = text[:i]
            break
    return text if len(text) <= HELP_CHARS else text[: HELP_CHARS - 1].rstrip() + "…"


def field_help(cls: type, field: str, where: str) -> str:
    """`--flag`'s help: what the field means (its docstring's first sentence), then the YAML key it sets."""
    doc = _docstrings(cls).get(field)
    text = f"{_first_sentence(doc)} [{where}]" if doc else where
    return text.replace("%", "%%")  # (argparse formats help with %)
