"""`toolkit catalog`: list the accelerators, offers and presets the estimates use, or show one row whole. Kept apart
from cli.py's job commands."""

from __future__ import annotations

import json

from ..estimate.params import count_params
from ..specs import SpecError, load_catalog
from ..specs.errors import did_you_mean
from ..specs.fields import to_dict
from ..views.text import count

__all__ = ["cmd_catalog"]


def cmd_catalog(args) -> int:
    catalog = load_catalog(*args.catalog)
    kinds = ("accelerators", "offers", "presets")
    kind = args.kind.lower()
    if kind not in kinds:
        raise SpecError("catalog", args.kind, f"unknown kind{did_you_mean(kind, kinds)}; allowed: {', '.join(kinds)}")
    lookup = {"accelerators": catalog.accelerator, "offers": catalog.offer, "presets": catalog.preset}[kind]
    rows = [lookup(args.name)] if args.name else list(getattr(catalog, kind).values())
    if args.json:
        print(
            json.dumps([to_dict(r) for r in rows] if not args.name else to_dict(rows[0]), indent=2, ensure_ascii=False)
        )
        return 0
    if args.name:
        for key, value in to_dict(rows[0]).items():
            print(f"{key:>24}: {'unknown' if value is None else value}")
        if kind == "presets" and rows[0].model.has_shape:
            counts = count_params(rows[0].model)
            print(f"{'params (counted)':>24}: {counts.total:,}")
            print(f"{'active (counted)':>24}: {counts.active:,} (embedding {counts.embedding:,} included)")
        return 0
    print(_table(kind, rows))
    return 0


def _table(kind: str, rows) -> str:
    if kind == "accelerators":
        head = ("name", "vendor", "memory", "bf16 TFLOP/s", "fp16", "fp8", "as_of")
        body = [
            (
                r.name,
                r.vendor,
                f"{r.memory_bytes / 2**30:.0f} GiB" if r.memory_bytes else "unknown",
                *(_peak(r, d) for d in ("bf16", "fp16", "fp8")),
                r.as_of,
            )
            for r in rows
        ]
    elif kind == "offers":
        head = ("name", "provider", "devices", "on-demand/h", "spot/h", "currency", "as_of")
        body = [
            (
                r.name,
                r.provider,
                f"{r.count}x{r.accelerator}",
                _num(r.on_demand_per_hour),
                _num(r.spot_per_hour_high),
                r.currency,
                r.as_of,
            )
            for r in rows
        ]
    else:
        head = ("name", "params", "active", "layers", "hidden", "heads", "seq", "tokens", "as_of")
        body = [
            (
                r.name,
                count(count_params(r.model).total),
                count(count_params(r.model).active),
                r.model.layers,
                r.model.hidden,
                r.model.heads,
                r.model.seq_len,
                count(r.tokens) if r.tokens else "unknown",
                r.as_of,
            )
            for r in rows
        ]
    table = [head] + [tuple(str(c) for c in row) for row in body]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def _peak(acc, dtype) -> str:
    if dtype in acc.unsupported:
        return "n/a"
    value = acc.peak_tflops.get(dtype)
    return "unknown" if value is None else f"{value:g}"


def _num(x) -> str:
    return "unknown" if x is None else f"{x:g}"
