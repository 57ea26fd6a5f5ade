"""Reading YAML and JSON files with errors that name the file and the line, and checking the folder a file
will be written into before any work is done."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from .errors import SpecError

__all__ = ["read_yaml", "read_json", "check_output_folder"]


def _read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if not path.exists():
        raise SpecError(what, str(path), "file not found; check the path")
    if path.is_dir():
        raise SpecError(what, str(path), "is a folder; give the file inside it")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(what, str(path), f"cannot be read ({err.__class__.__name__}: {err})") from None


def read_yaml(path: str | Path, what: str = "file"):
    text = _read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(what, str(path), f"is not valid YAML{where}: {problem}") from None


def read_json(path: str | Path, what: str = "file"):
    text = _read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(
            what, str(path), f"is not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None


def check_output_folder(flag: str, path: str | Path) -> None:
    """Refuse, in one line, a file to write whose folder is missing or read-only."""
    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        raise SpecError(flag, str(path), f"its folder {folder} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK):
        raise SpecError(flag, str(path), f"its folder {folder} is not writable; write elsewhere")
