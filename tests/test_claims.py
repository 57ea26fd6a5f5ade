"""`toolkit claims`: the seed article's claims recomputed from the catalog and the estimator, never stored."""

import json

from toolkit.cli import main
from toolkit.plan.claims import check_claims

VERDICTS = {"true", "partly true", "misleading", "false", "unverified"}


def test_claims_json_lists_at_least_ten_with_their_evidence(capsys):
    assert main(["claims", "--json"]) == 0
    claims = json.loads(capsys.readouterr().out)["claims"]
    assert len(claims) >= 10
    for c in claims:
        assert {"claim", "computed", "verdict", "source"} <= set(c) and c["verdict"] in VERDICTS and c["source"]
    assert sum(c["computed"] is not None for c in claims) >= 10
    by_id = {c["id"]: c for c in claims}
    assert "3,638 PF-days" in by_id["gpt3-pf-days"]["computed"]  # Brown et al.: 3.14e23 FLOPs = 3,640
    assert by_id["gpt3-pf-days"]["verdict"] == "true"
    assert by_id["fp16-gradients-75"]["verdict"] == "false"  # 2 bytes against 4: half, not a quarter
    assert by_id["mlu370-192gb"]["verdict"] == "false"  # Cambricon: 48 GB


def test_a_verdict_follows_the_catalog_it_is_computed_from(tmp_path):
    """With a user catalog that gives the MLU370-X8 192 GB, that claim turns true: computed, not stored."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "accelerators:\n  - name: MLU370-X8\n    vendor: Cambricon\n    memory_bytes: 206158430208\n"
        "    peak_tflops: {fp32: 32.0, tf32: n/a, fp16: 96.0, bf16: 96.0, fp8: n/a, int8: unknown}\n"
        "    source: a test\n    as_of: 2026-12-02\n"
    )
    from toolkit.specs import load_catalog

    claims = {c.id: c for c in check_claims(load_catalog(mine))}
    assert claims["mlu370-192gb"].verdict == "true" and "192 GB" in claims["mlu370-192gb"].computed


def test_claims_text_names_each_verdict(capsys):
    assert main(["claims"]) == 0
    out = capsys.readouterr().out
    assert out.count("computed:") >= 10 and "MISLEADING" in out and "FALSE" in out
