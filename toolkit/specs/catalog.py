"""Catalogs of accelerators, cloud offers and model presets, read from toolkit/data/*.yaml.

Every row carries `source` and `as_of`. Users add or override rows from their own YAML
file (`--catalog my.yaml`); an override row must name its own source and date too.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import SpecError, did_you_mean
from .fields import from_dict
from .model import ModelSpec
from .yamlio import read_yaml

__all__ = ["Accelerator", "Offer", "Preset", "Catalog", "load_catalog", "DTYPES", "DATA_DIR"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
_NA = "n/a"


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str
    vendor: str
    memory_bytes: int | None
    """Capacity as the device reports it (vendors' "80GB" HBM = 80 GiB)."""
    memory_bw_bytes_per_s: float | None
    link_bw_bytes_per_s: float | None
    """Intra-node link as the vendor quotes it: bidirectional, aggregate per device."""
    tdp_w: float | None
    peak_tflops: dict[str, float | None]
    """Dense peak TFLOP/s per dtype; None = unknown. Dtypes the device lacks are in `unsupported`."""
    source: str
    as_of: str
    unsupported: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    flags: str | None = None
    notes: str | None = None
    assumptions: dict[str, Any] | None = None
    """Figures measured on this device that replace the step-time model's assumptions (toolkit calibrate writes
    them: gemm_fraction, link_efficiency, latency_intra_s, op_overhead_s, ...)."""
    network_bits_per_s_per_device: float | None = None
    """Network across nodes in the device's reference system, bits/s per device one way (DGX A100: 8 × 200 Gb/s
    for 8 GPUs): the default when neither the job nor its offer gives a figure."""
    network_source: str | None = None
    """Where network_bits_per_s_per_device comes from."""
    allreduce_bus_bw_bytes_per_s: float | None = None
    """Measured all-reduce bus bandwidth inside one node where the switch reduces (NVLink SHARP on HGX H100/H200),
    above what the link alone gives a ring; None = the ring's."""
    nvlink_domain: int | None = None
    """GPUs that share one NVLink domain where it is wider than a node (72 in a GB200/GB300 NVL72 rack): a job that
    keeps the default 8 GPUs a node gets the domain instead (toolkit.specs.resolve)."""
    host_link_bytes_per_s: float | None = None
    """The device's link to its host (PCIe), one way, nominal: what offloaded states cross each step."""
    host_link_source: str | None = None
    """Where host_link_bytes_per_s comes from."""
    device_memory: dict[str, Any] | None = None
    """Figures measured on this device that replace the device-memory assumptions (toolkit.estimate.device:
    context_bytes, workspace_bytes, fragmentation, comm_channels, ...)."""
    microscaling: bool = False
    """Tensor cores that scale by 32-element blocks in hardware (OCP MX formats: MXFP8, MXFP4), as Blackwell's and
    CDNA 4's: what an mxfp8 recipe needs."""
    host_memory_gib_per_node: float | None = None
    """Host RAM of the device's reference system (a DGX/HGX node), GiB: offload's limit when no offer gives one."""
    host_memory_source: str | None = None
    step_calibration: dict[str, Any] | None = None
    """A user's measured step on this accelerator (`toolkit calibrate --step-s`): {scale, measured_step_s,
    modelled_step_s, job}. Every step modelled on it is multiplied by `scale` (their software stack's speed against
    the model's), and its likely range is the one calibrated runs hold (toolkit.estimate.band)."""

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for `dtype`, or None when unknown or unsupported."""
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * 1e12


@dataclass(frozen=True, kw_only=True)
class Offer:
    name: str
    provider: str
    region: str | None
    accelerator: str
    count: int
    """Accelerators per instance; billing is per whole instance."""
    currency: str
    on_demand_per_hour: float | None
    spot_per_hour_low: float | None
    spot_per_hour_high: float | None
    network_bw_bytes_per_s: float | None
    source: str
    as_of: str
    flags: str | None = None
    notes: str | None = None
    host_memory_gib: float | None = None
    """The instance's RAM (GiB): what offloaded states of its devices must fit in."""


@dataclass(frozen=True, kw_only=True)
class Preset:
    name: str
    model: ModelSpec
    params_published: int | None
    params_published_kind: Literal["exact", "rounded"]
    source: str
    as_of: str
    global_batch_sequences: int | None = None
    global_batch_tokens: float | None = None
    tokens: float | None = None
    active_params_published: float | None = None
    """A Mixture of Experts: the parameters one token uses, as its source counts them (its flags say what that
    count leaves out)."""
    flags: str | None = None
    notes: str | None = None

    def global_batch_in_sequences(self) -> int | None:
        """The published batch in sequences (a token-denominated batch is rounded up)."""
        if self.global_batch_sequences is not None:
            return self.global_batch_sequences
        if self.global_batch_tokens is not None:
            return -(-int(self.global_batch_tokens) // self.model.seq_len)
        return None


def _accelerator_row(row: dict, where: str) -> Accelerator:
    row = dict(row)
    peaks = row.pop("peak_tflops", None)
    if not isinstance(peaks, dict):
        raise SpecError(f"{where}.peak_tflops", peaks, f"expected a mapping with keys {', '.join(DTYPES)}")
    unknown = [k for k in peaks if k not in DTYPES]
    if unknown:
        raise SpecError(
            f"{where}.peak_tflops.{unknown[0]}",
            peaks[unknown[0]],
            f"unknown dtype{did_you_mean(unknown[0], DTYPES)}; allowed: {', '.join(DTYPES)}",
        )
    missing = [d for d in DTYPES if d not in peaks]
    if missing:
        raise SpecError(
            f"{where}.peak_tflops.{missing[0]}",
            None,
            "is required: give a number, `unknown` (not published) or `n/a` (not supported)",
        )
    row["unsupported"] = [d for d, v in peaks.items() if isinstance(v, str) and v.strip().lower() == _NA]
    row["peak_tflops"] = {d: (None if d in row["unsupported"] else v) for d, v in peaks.items()}
    acc = from_dict(Accelerator, row, where)
    for d, v in acc.peak_tflops.items():
        if v is not None and v <= 0:
            raise SpecError(f"{where}.peak_tflops.{d}", v, "must be greater than zero")
        if v is not None and v > 1e5:
            raise SpecError(
                f"{where}.peak_tflops.{d}", v, "is in TFLOP/s, and this looks like FLOP/s: write 989e12 FLOP/s as 989"
            )
    _check_units(acc, where)
    return acc


_UNITS = {  # field: (lowest plausible, highest plausible, the fix when a figure is off by a unit's factor)
    "memory_bytes": (2**30, 2**44, "is in bytes and this looks like GB or GiB: write 80 GiB as 85899345920"),
    # (from 1e6: `toolkit calibrate` measures the job's element-wise rate, which a loaded CPU can bring to 5e7)
    "memory_bw_bytes_per_s": (1e6, 1e14, "is in bytes per second and this looks like GB/s: write 3.35 TB/s as 3.35e12"),
    "link_bw_bytes_per_s": (1e8, 1e14, "is in bytes per second and this looks like GB/s: write 900 GB/s as 900e9"),
    "network_bw_bytes_per_s": (
        1e8,
        1e14,
        "is in bytes per second per instance and this looks like Gb/s: write 3,200 Gb/s as 400e9",
    ),
    "tdp_w": (1, 1e4, "is in watts per device"),
    "allreduce_bus_bw_bytes_per_s": (
        1e8,
        1e14,
        "is in bytes per second and this looks like GB/s: write 480 GB/s as 480e9",
    ),
    "network_bits_per_s_per_device": (
        1e8,
        1e14,
        "is in bits per second per device and this looks like Gb/s: write 400 Gb/s as 400e9",
    ),
}
"""A unit slip (GB for bytes, Gb/s for bytes per second) is off by 10^9 or more: outside these ranges a figure
is refused with the fix, instead of a 1,000,000,000-fold answer."""


def _check_units(item, where: str) -> None:
    for name, (low, high, fix) in _UNITS.items():
        value = getattr(item, name, None)
        if value is not None and not low <= value <= high:
            raise SpecError(f"{where}.{name}", value, fix)


def _offer_row(row: dict, where: str) -> Offer:
    offer = from_dict(Offer, row, where)
    _check_units(offer, where)
    return offer


@dataclass(frozen=True, kw_only=True)
class ExchangeRate:
    name: str
    """ISO currency code, e.g. CNY."""
    per_usd: float
    """Units of this currency for one US dollar."""
    source: str
    as_of: str


_KINDS = {
    "accelerators": _accelerator_row,
    "offers": _offer_row,
    "presets": lambda row, where: from_dict(Preset, row, where),
    "exchange_rates": lambda row, where: from_dict(ExchangeRate, row, where),
}


@dataclass(frozen=True)
class Catalog:
    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    offers: dict[str, Offer] = field(default_factory=dict)
    presets: dict[str, Preset] = field(default_factory=dict)
    exchange_rates: dict[str, ExchangeRate] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    # ---- lookups (case-insensitive, with suggestions) ---------------------------------
    def accelerator(self, name: str, field_name: str = "cluster.accelerator") -> Accelerator:
        key = str(name).strip().lower()
        for acc in self.accelerators.values():
            if key == acc.name.lower() or key in (a.lower() for a in acc.aliases):
                return acc
        raise SpecError(
            field_name,
            name,
            "unknown accelerator"
            + did_you_mean(name, self._acc_names())
            + f"; known: {', '.join(a.name for a in self.accelerators.values())}",
        )

    def offer(self, name: str, field_name: str = "cost.offer") -> Offer:
        found = self.offers.get(str(name).strip().lower())
        if found is None:
            raise SpecError(
                field_name,
                name,
                "unknown offer"
                + did_you_mean(name, [o.name for o in self.offers.values()])
                + "; list them with `toolkit catalog offers`",
            )
        return found

    def preset(self, name: str, field_name: str = "model.preset") -> Preset:
        found = self.presets.get(str(name).strip().lower())
        if found is None:
            raise SpecError(
                field_name,
                name,
                "unknown preset"
                + did_you_mean(name, [p.name for p in self.presets.values()])
                + "; list them with `toolkit catalog presets`",
            )
        return found

    def to_usd(self, amount: float | None, currency: str | None, field_name: str = "cost.currency") -> float | None:
        """`amount` in US dollars, by the catalog's dated rate (add yours in exchange_rates of --catalog)."""
        if amount is None or currency is None or currency.upper() == "USD":
            return amount
        rate = self.exchange_rates.get(currency.lower())
        if rate is None:
            raise SpecError(
                field_name,
                currency,
                "has no exchange rate in the catalog: add a row under "
                "`exchange_rates:` (name, per_usd, source, as_of) with --catalog",
            )
        return amount / rate.per_usd

    def _acc_names(self) -> list[str]:
        return [n for a in self.accelerators.values() for n in (a.name, *a.aliases)]

    # ---- building ------------------------------------------------------------------------
    def merged_with(self, path: str | Path) -> Catalog:
        """A new catalog with the rows of a user file added, or merged over rows of the same name."""
        data = read_yaml(path, what="catalog file")
        label = Path(path).name
        if not isinstance(data, dict):
            raise SpecError(label, data, f"expected a mapping with any of the keys {', '.join(_KINDS)}")
        tables = {kind: dict(getattr(self, kind)) for kind in _KINDS}
        for kind, rows in data.items():
            if kind not in _KINDS:
                raise SpecError(
                    f"{label}: {kind}",
                    None,
                    f"unknown section{did_you_mean(kind, _KINDS)}; allowed: {', '.join(_KINDS)}",
                )
            if not isinstance(rows, list):
                raise SpecError(f"{label}: {kind}", rows, "expected a list of rows")
            for i, row in enumerate(rows):
                where = f"{label}: {kind}[{i}]"
                if not isinstance(row, dict) or "name" not in row:
                    raise SpecError(where, row, "each row needs at least `name`, `source` and `as_of`")
                for required in ("source", "as_of"):
                    if row.get(required) in (None, ""):
                        raise SpecError(
                            f"{where}.{required}", None, "is required: every figure says where it comes from and when"
                        )
                key = str(row["name"]).lower()
                base = tables[kind].get(key)
                if base is not None:
                    row = {**_as_row(kind, base), **row}
                tables[kind][key] = _KINDS[kind](row, where)
        merged = Catalog(**tables, files=(*self.files, str(path)))
        merged.check_links()
        return merged

    def check_links(self) -> None:
        """Every offer must name an accelerator the catalog knows."""
        for offer in self.offers.values():
            self.accelerator(offer.accelerator, f"offers.{offer.name}.accelerator")


def _as_row(kind: str, item) -> dict:
    """Turn a catalog item back into a row that `_KINDS[kind]` accepts (for merging)."""
    row = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if kind == "accelerators":
        unsupported = row.pop("unsupported")
        row["peak_tflops"] = {d: (_NA if d in unsupported else v) for d, v in row["peak_tflops"].items()}
    if kind == "presets":
        row["model"] = {f.name: getattr(item.model, f.name) for f in dataclasses.fields(item.model)}
    return row


@functools.cache
def _builtin() -> Catalog:
    tables = {}
    for kind, make in _KINDS.items():
        rows = read_yaml(DATA_DIR / f"{kind}.yaml", what="built-in catalog")[kind]
        tables[kind] = {str(r["name"]).lower(): make(r, f"{kind}.yaml: {r.get('name')}") for r in rows}
    catalog = Catalog(**tables, files=tuple(str(DATA_DIR / f"{k}.yaml") for k in _KINDS))
    catalog.check_links()
    return catalog


def load_catalog(*extra_files: str | Path) -> Catalog:
    """The built-in catalog, with each user file merged over it in order."""
    catalog = _builtin()
    for path in extra_files:
        catalog = catalog.merged_with(path)
    return catalog
