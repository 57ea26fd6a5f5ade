"""Dataclass <-> plain dict conversion with strict checks.

Every spec is a frozen dataclass; this module turns the dicts read from YAML, JSON or
the CLI into them. It refuses unknown keys (suggesting the closest one), wrong types
and values outside a `Literal[...]`, each with the dotted path of the field. We wrote
this instead of using pydantic so that every message is one line in our words, and
so that building a Job (done on every slider move) costs microseconds.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from .errors import SpecError, did_you_mean

__all__ = ["from_dict", "to_dict", "parse_number", "check_positive", "check_range"]

_UNKNOWN_MARKERS = ("unknown", "n/a", "null", "none", "")


def parse_number(value: Any, field: str, *, integer: bool = False) -> float | int:
    """Accept 300e9, '300e9', '3.0e11', 1_000 (YAML reads '300e9' as a string)."""
    if isinstance(value, bool):
        raise SpecError(field, value, "expected a number, not true/false")
    if isinstance(value, str):
        text = value.strip().replace("_", "").replace(",", "")
        try:
            value = float(text)
        except ValueError:
            raise SpecError(field, value, "expected a number such as 8, 0.45 or 300e9") from None
    if not isinstance(value, (int, float)):
        raise SpecError(field, value, f"expected a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, value, "expected a finite number")
    if integer:
        if float(value) != int(value):
            raise SpecError(field, value, "expected a whole number")
        return int(value)
    return float(value) if isinstance(value, float) else value


def check_positive(value: float | int | None, field: str, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        need = "zero or more" if allow_zero else "greater than zero"
        raise SpecError(field, value, f"must be {need}")


def check_range(value: float | None, field: str, low: float, high: float, *, low_open=False, high_open=False) -> None:
    if value is None:
        return
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise SpecError(field, value, f"must lie in {lo}{low:g}, {high:g}{hi}")


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            return True, args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007 - a Union built at run time
    return False, tp


def _convert(tp: Any, value: Any, field: str) -> Any:
    optional, tp = _is_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _UNKNOWN_MARKERS):
        if optional:
            return None
        raise SpecError(field, value, "a value is required here")
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):  # e.g. `int | Literal["max"]`: the first member that takes the value
        members = get_args(tp)
        for member in members[:-1]:
            try:
                return _convert(member, value, field)
            except SpecError:
                pass
        try:
            return _convert(members[-1], value, field)
        except SpecError:
            shown = " or ".join(
                ", ".join(map(str, get_args(m))) if get_origin(m) is Literal else getattr(m, "__name__", str(m))
                for m in members
            )
            raise SpecError(field, value, f"expected {shown}") from None
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, str):
            for choice in allowed:
                if isinstance(choice, str) and choice.lower() == value.strip().lower():
                    return choice
        if value in allowed and type(value) is type(allowed[0]):
            return value
        if all(isinstance(a, int) for a in allowed) and isinstance(value, (str, float)):
            try:
                number = parse_number(value, field, integer=True)
            except SpecError:
                number = None
            if number in allowed:
                return number
        shown = ", ".join(str(a) for a in allowed)
        hint = did_you_mean(value, [str(a) for a in allowed]) if isinstance(value, str) else ""
        raise SpecError(field, value, f"allowed: {shown}{hint}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, field)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "false", "no", "off"):
            return value.strip().lower() in ("true", "yes", "on")
        raise SpecError(field, value, "expected true or false")
    if tp is int:
        return parse_number(value, field, integer=True)
    if tp is float:
        return float(parse_number(value, field))
    if tp is str:
        if isinstance(value, datetime.date):
            return value.isoformat()
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise SpecError(field, value, "expected text")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise SpecError(field, value, "expected a list")
        (item_tp, *_rest) = get_args(tp) or (Any,)
        return tuple(_convert(item_tp, v, f"{field}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(field, value, "expected a mapping of names to values")
        _key_tp, val_tp = get_args(tp)
        return {str(k): _convert(val_tp, v, f"{field}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    raise TypeError(f"fields.py cannot convert to {tp!r} (field {field})")


@functools.cache
def _schema(cls: type) -> tuple[dict, dict]:
    """Type hints and init fields of a dataclass, computed once per class (resolving hints is slow)."""
    return get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass `cls` from a mapping, refusing unknown keys and bad values."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise SpecError(path or cls.__name__, data, f"expected a mapping of {cls.__name__} fields")
    hints, fields = _schema(cls)
    kwargs = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        where = f"{path}.{key}" if path else str(key)
        if name not in fields:
            allowed = ", ".join(fields)
            raise SpecError(where, value, f"unknown key{did_you_mean(name, fields)}; allowed keys: {allowed}")
        kwargs[name] = _convert(hints[name], value, where)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{path}.{missing[0]}" if path else missing[0]
        raise SpecError(where, None, "is required")
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain dict of a dataclass tree (tuples become lists) for YAML and JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
