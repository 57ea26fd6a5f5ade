"""Catalog rows: sourced and dated, looked up case-insensitively, overridable from a user file."""

import pytest

from toolkit.specs import SpecError, load_catalog
from toolkit.specs.catalog import DTYPES

REQUIRED_ACCELERATORS = [
    "V100-32GB",
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H200",
    "L40S",
    "RTX-4090",
    "MI250X",
    "MI300X",
    "Ascend-910B",
    "MLU370-X8",
    "DCU-Z100",
    "TPU-v4",
    "TPU-v5e",
    "TPU-v5p",
    "Gaudi2",
]
REQUIRED_OFFERS = [
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
    "g6e.48xlarge",
    "a2-megagpu-16g",
    "a3-highgpu-8g",
    "ND96asr_A100_v4",
    "ND96isr_H100_v5",
    "ecs.gn6e-c12g1.24xlarge",
    "ecs.gn7-c13g1.26xlarge",
    "ecs.gn7e-c16g1.32xlarge",
    "GN10Xp.20XLARGE320",
]


def test_every_row_has_source_and_date(catalog):
    rows = [*catalog.accelerators.values(), *catalog.offers.values(), *catalog.presets.values()]
    assert len(rows) >= 50
    for row in rows:
        assert len(row.source) > 10, row.name
        assert len(row.as_of) == 10 and row.as_of[4] == "-", (row.name, row.as_of)


def test_required_rows_exist(catalog):
    for name in REQUIRED_ACCELERATORS:
        assert catalog.accelerator(name).name == name
    for name in REQUIRED_OFFERS:
        assert catalog.offer(name).name == name


@pytest.mark.parametrize(
    "query, name",
    [
        ("a100-80gb", "A100-80GB"),
        ("h100", "H100-SXM"),
        ("rtx-4090", "RTX-4090"),
        ("ASCEND-910B", "Ascend-910B"),
        ("mlu370-x8", "MLU370-X8"),
    ],
)
def test_lookup_is_case_insensitive_with_aliases(catalog, query, name):
    assert catalog.accelerator(query).name == name


def test_memory_is_gib_as_reported(catalog):
    assert catalog.accelerator("A100-80GB").memory_bytes == 80 * 2**30
    assert catalog.accelerator("RTX-4090").memory_bytes == 24 * 2**30
    # The seed article claims 192 GB HBM2e; Cambricon's release says 48 GB LPDDR5.
    assert catalog.accelerator("MLU370-X8").memory_bytes == 48 * 2**30


def test_unknown_and_unsupported_are_kept_apart(catalog):
    dcu = catalog.accelerator("DCU-Z100")
    assert all(dcu.peak_flops(d) is None for d in DTYPES)
    assert dcu.flags and "MI50" in dcu.flags
    v100 = catalog.accelerator("V100-32GB")
    assert "bf16" in v100.unsupported and v100.peak_flops("fp16") == 125e12
    assert catalog.accelerator("H100-SXM").peak_flops("bf16") == pytest.approx(989.4e12)  # dense, not 1979 sparse


def test_offer_prices_are_per_instance(catalog):
    p4de = catalog.offer("p4de.24xlarge")
    assert p4de.count == 8 and p4de.on_demand_per_hour == pytest.approx(27.447)
    assert catalog.offer("GN10Xp.20XLARGE320").on_demand_per_hour is None  # not published: the user supplies it
    assert catalog.offer("ecs.gn7e-c16g1.32xlarge").currency == "CNY"


def test_user_file_overrides_and_adds_rows(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "offers:\n"
        "  - {name: GN10Xp.20XLARGE320, on_demand_per_hour: 180.5, source: 'our Tencent quote', as_of: 2026-11-20}\n"
        "accelerators:\n"
        "  - name: MY-NPU\n    vendor: Me\n    memory_bytes: 34359738368\n    memory_bw_bytes_per_s: 1.0e12\n"
        "    link_bw_bytes_per_s: unknown\n    tdp_w: 300\n"
        "    peak_tflops: {fp32: 20, tf32: n/a, fp16: 200, bf16: 200, fp8: n/a, int8: unknown}\n"
        "    source: our benchmark\n    as_of: 2026-11-01\n"
    )
    catalog = load_catalog(path)
    tencent = catalog.offer("gn10xp.20xlarge320")
    assert tencent.on_demand_per_hour == 180.5 and tencent.count == 8 and tencent.source == "our Tencent quote"
    assert catalog.accelerator("my-npu").peak_flops("bf16") == 200e12
    assert load_catalog().offer("GN10Xp.20XLARGE320").on_demand_per_hour is None  # built-in left alone


def test_override_must_name_its_source(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("offers:\n  - {name: p5.48xlarge, on_demand_per_hour: 1.0, as_of: 2026-11-01}\n")
    with pytest.raises(SpecError, match="source"):
        load_catalog(path)


NPU = (
    "accelerators:\n  - name: MY-NPU\n    vendor: Me\n    memory_bytes: {memory}\n"
    "    memory_bw_bytes_per_s: 1.0e12\n    link_bw_bytes_per_s: unknown\n    tdp_w: 300\n"
    "    peak_tflops: {{fp32: 20, tf32: n/a, fp16: {fp16}, bf16: 200, fp8: n/a, int8: unknown}}\n"
    "    source: our benchmark\n    as_of: 2026-11-01\n"
)


@pytest.mark.parametrize(
    "text, field, fix",
    [
        (NPU.format(memory=32, fp16=200), "accelerators[0].memory_bytes = 32", "write 80 GiB as 85899345920"),
        (NPU.format(memory=34359738368, fp16=200e12), "accelerators[0].peak_tflops.fp16", "looks like FLOP/s"),
        (
            "offers:\n  - {name: p5.48xlarge, network_bw_bytes_per_s: 3200, source: a quote, as_of: 2026-11-01}\n",
            "offers[0].network_bw_bytes_per_s = 3200",
            "looks like Gb/s",
        ),
        (
            "offers:\n  - {name: p5.48xlarge, on_demand_per_hour: 1.0, source: '', as_of: 2026-11-01}\n",
            "offers[0].source",
            "where it comes from",
        ),
    ],
)
def test_a_row_in_the_wrong_unit_or_without_a_source_is_named_with_the_fix(tmp_path, text, field, fix):
    """A unit slip (GB for bytes, FLOP/s for TFLOP/s, Gb/s for bytes per second) would change an answer a
    billion-fold: the user's row is refused in one line naming the file, the field and the fix."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as refused:
        load_catalog(path)
    assert f"mine.yaml: {field}" in str(refused.value) and fix in str(refused.value)


def test_a_slow_measured_memory_rate_is_not_taken_for_a_unit_slip(tmp_path):
    """`toolkit calibrate` wrote 5.2e7 B/s for a CPU's element-wise rate under load (ci73): a figure, not a GB/s
    slip (which would read 3.35), so a profile holding it loads."""
    path = tmp_path / "profile.yaml"
    path.write_text(NPU.format(memory=34359738368, fp16=200).replace("1.0e12", "5.2e7"))
    assert load_catalog(path).accelerator("MY-NPU").memory_bw_bytes_per_s == 5.2e7
    path.write_text(NPU.format(memory=34359738368, fp16=200).replace("1.0e12", "3.35"))
    with pytest.raises(SpecError, match="looks like GB/s"):
        load_catalog(path)
