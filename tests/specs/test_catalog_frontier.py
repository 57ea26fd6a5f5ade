"""Today's accelerators (Blackwell, Blackwell Ultra, the export-control Hoppers and Ampere, H100 PCIe/NVL, L4, A10G,
MI325X, MI355X) and their offers: every row loads through the built-in catalog with a source and a date, the names
people type find it, and one physical check per family catches a typo (a dropped digit, a sparse figure taken for
a dense one, GB written for bytes)."""

import pytest

from toolkit.specs import load_catalog
from toolkit.specs.catalog import DTYPES

GIB = 2**30

NEW_ACCELERATORS = [
    "B200",
    "GB200",
    "B300",
    "GB300",
    "H800",
    "H20",
    "A800-80GB",
    "H100-PCIe",
    "H100-NVL",
    "L4",
    "A10G",
    "MI325X",
    "MI355X",
]
NEW_OFFERS = {  # offer: (accelerator, count)
    "p6-b200.48xlarge": ("B200", 8),
    "p6-b300.48xlarge": ("B300", 8),
    "g6.48xlarge": ("L4", 8),
    "g5.xlarge": ("A10G", 1),
    "NC40ads_H100_v5": ("H100-NVL", 1),
    "lambda-gpu_8x_b200_sxm6": ("B200", 8),
    "lambda-gpu_1x_h100_pcie": ("H100-PCIe", 1),
    "nebius-gpu-b200-sxm_8gpu": ("B200", 8),
    "runpod-8x_B200_SECURE": ("B200", 8),
}
BLACKWELL = ["B200", "GB200", "B300", "GB300"]


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.mark.parametrize("name", NEW_ACCELERATORS)
def test_every_new_row_loads_with_its_source_and_date(cat, name):
    acc = cat.accelerator(name)
    assert acc.name == name
    assert acc.vendor in ("NVIDIA", "AMD")
    assert len(acc.source) > 40, name  # a document, not a word
    assert acc.as_of == "2026-12-06"
    assert set(acc.peak_tflops) == set(DTYPES)
    assert acc.memory_bytes and 16 * GIB <= acc.memory_bytes <= 320 * GIB
    assert 2e11 <= acc.memory_bw_bytes_per_s <= 1e13
    assert acc.notes, f"{name}: the NVLink domain / FP4 / NICs per GPU live in notes until the class has fields"


@pytest.mark.parametrize(
    "query, name",
    [
        ("b200-sxm", "B200"),
        ("HGX-B200", "B200"),
        ("GB200-NVL72", "GB200"),
        ("hgx-b300", "B300"),
        ("GB300-NVL72", "GB300"),
        ("h800-sxm5", "H800"),
        ("a800", "A800-80GB"),
        ("H100-PCIE", "H100-PCIe"),
        ("h100-nvl", "H100-NVL"),
        ("l4", "L4"),
        ("a10g", "A10G"),
        ("Instinct-MI355X", "MI355X"),
    ],
)
def test_the_names_people_type_find_the_row(cat, query, name):
    assert cat.accelerator(query).name == name


@pytest.mark.parametrize("name", [n for n in NEW_ACCELERATORS if n not in ("A10G", "A800-80GB")])  # Ampere: no FP8
def test_fp8_is_twice_the_16_bit_rate(cat, name):
    """On Hopper, Ada, Blackwell and CDNA 3/4 the dense FP8 rate is twice BF16's: a sparse figure on one side only
    (or a typo) breaks the ratio."""
    acc = cat.accelerator(name)
    assert acc.peak_tflops["fp16"] == acc.peak_tflops["bf16"]
    assert acc.peak_tflops["fp8"] == pytest.approx(2 * acc.peak_tflops["bf16"], rel=0.01)


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_is_above_hopper_but_not_by_a_sparsity_factor(cat, name):
    h100, h200, acc = cat.accelerator("H100-SXM"), cat.accelerator("H200"), cat.accelerator(name)
    assert h100.peak_tflops["bf16"] < acc.peak_tflops["bf16"] < 2.6 * h100.peak_tflops["bf16"]  # 2,250-2,500 dense
    assert acc.memory_bytes > h200.memory_bytes
    assert acc.memory_bw_bytes_per_s > h200.memory_bw_bytes_per_s
    assert acc.link_bw_bytes_per_s == pytest.approx(2 * h100.link_bw_bytes_per_s)  # NVLink5: 1.8 TB/s
    assert acc.tdp_w > h100.tdp_w
    assert acc.network_bits_per_s_per_device >= h100.network_bits_per_s_per_device
    assert "FP4" in acc.notes and "NVLink domain" in acc.notes
    domain = "72" if name.startswith("GB") else "8"
    assert f"NVLink domain {domain} GPUs" in acc.notes


def test_blackwell_ultra_has_more_memory_and_the_superchip_runs_faster(cat):
    b200, gb200, b300, gb300 = (cat.accelerator(n) for n in BLACKWELL)
    assert b300.memory_bytes > b200.memory_bytes and gb300.memory_bytes > gb200.memory_bytes
    assert gb200.peak_tflops["bf16"] > b200.peak_tflops["bf16"]  # 1,200 W against HGX's 1,000 W
    assert b300.network_bits_per_s_per_device == 2 * b200.network_bits_per_s_per_device  # ConnectX-8 against -7
    assert b300.peak_flops("int8") is None and b200.peak_flops("int8") == pytest.approx(4500e12)


def test_the_export_hoppers_keep_h100_silicon_with_a_cut_link_or_cut_compute(cat):
    h100, h800, h20 = cat.accelerator("H100-SXM"), cat.accelerator("H800"), cat.accelerator("H20")
    assert h800.peak_tflops == h100.peak_tflops and h800.memory_bytes == h100.memory_bytes
    assert h800.link_bw_bytes_per_s == pytest.approx(400e9) and h800.link_bw_bytes_per_s < h100.link_bw_bytes_per_s
    assert h20.link_bw_bytes_per_s == h100.link_bw_bytes_per_s
    assert 0.1 < h20.peak_tflops["bf16"] / h100.peak_tflops["bf16"] < 0.2  # 148 of 989
    assert h20.memory_bytes == 96 * GIB and h20.memory_bw_bytes_per_s > h100.memory_bw_bytes_per_s


def test_the_pcie_and_nvl_hoppers_run_below_the_sxm_part(cat):
    sxm, pcie, nvl = cat.accelerator("H100-SXM"), cat.accelerator("H100-PCIe"), cat.accelerator("H100-NVL")
    for card in (pcie, nvl):
        assert card.peak_tflops["bf16"] < sxm.peak_tflops["bf16"] and card.tdp_w < sxm.tdp_w
        assert card.link_bw_bytes_per_s < sxm.link_bw_bytes_per_s
    assert pcie.memory_bw_bytes_per_s < sxm.memory_bw_bytes_per_s < nvl.memory_bw_bytes_per_s
    assert sxm.memory_bytes < nvl.memory_bytes == 94 * GIB


def test_a800_is_an_a100_with_a_cut_link(cat):
    a100, a800 = cat.accelerator("A100-80GB"), cat.accelerator("A800-80GB")
    assert a800.peak_tflops == a100.peak_tflops and a800.unsupported == a100.unsupported
    assert a800.memory_bytes == a100.memory_bytes
    assert a800.link_bw_bytes_per_s == pytest.approx(400e9) and a800.link_bw_bytes_per_s < a100.link_bw_bytes_per_s


def test_the_small_inference_cards(cat):
    l4, l40s, a10g = cat.accelerator("L4"), cat.accelerator("L40S"), cat.accelerator("A10G")
    assert l4.peak_tflops["bf16"] < l40s.peak_tflops["bf16"] / 2 and l4.tdp_w < 100
    assert l4.memory_bytes == a10g.memory_bytes == 24 * GIB
    assert l4.memory_bw_bytes_per_s < a10g.memory_bw_bytes_per_s < l40s.memory_bw_bytes_per_s
    # No published tensor peaks for the A10G: unknown, not zero; Ampere has no FP8.
    assert all(a10g.peak_flops(d) is None for d in DTYPES)
    assert "fp8" in a10g.unsupported and a10g.flags and "--peak-tflops" in a10g.flags


def test_the_amd_parts_grow_on_the_mi300x(cat):
    mi300x, mi325x, mi355x = (cat.accelerator(n) for n in ("MI300X", "MI325X", "MI355X"))
    assert mi325x.peak_tflops == mi300x.peak_tflops  # the same CDNA 3 compute, more memory
    assert mi300x.memory_bytes < mi325x.memory_bytes < mi355x.memory_bytes
    assert mi300x.memory_bw_bytes_per_s < mi325x.memory_bw_bytes_per_s < mi355x.memory_bw_bytes_per_s
    assert 1.5 < mi355x.peak_tflops["bf16"] / mi300x.peak_tflops["bf16"] < 2.5
    assert mi355x.link_bw_bytes_per_s > mi300x.link_bw_bytes_per_s
    assert mi355x.tdp_w > mi325x.tdp_w > mi300x.tdp_w


@pytest.mark.parametrize("name", list(NEW_OFFERS))
def test_every_new_offer_is_priced_per_instance_and_sourced(cat, name):
    offer = cat.offer(name)
    accelerator, count = NEW_OFFERS[name]
    assert cat.accelerator(offer.accelerator).name == accelerator and offer.count == count
    assert offer.currency == "USD" and len(offer.source) > 30 and len(offer.as_of) == 10
    per_gpu = offer.on_demand_per_hour / offer.count
    assert 0.3 < per_gpu < 20, (name, per_gpu)  # a price per instance, not per GPU-second or per rack
    if offer.spot_per_hour_low is not None:
        assert offer.spot_per_hour_low <= offer.spot_per_hour_high < offer.on_demand_per_hour


def test_b200_offers_span_neoclouds_and_a_hyperscaler(cat):
    providers = {cat.offer(n).provider for n, (acc, _) in NEW_OFFERS.items() if acc == "B200"}
    assert {"AWS", "Lambda", "Nebius", "RunPod"} <= providers


def test_an_8xb200_estimate_runs_and_beats_8xh100(cli_json):
    b200 = cli_json("estimate", "--model", "llama3-8b", "--gpus", "8xB200")
    h100 = cli_json("estimate", "--model", "llama3-8b", "--gpus", "8xH100")
    assert b200["time"]["peak_flops_per_device"] == pytest.approx(2250e12)
    assert 0 < b200["time"]["step_s"] < h100["time"]["step_s"]
