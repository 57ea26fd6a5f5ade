"""The pipeline schedule simulator against the papers' closed forms, flow-shop theory, and what torch's
schedules execute on real gloo ranks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.estimate.pipeline import rank_orders, replay, simulate


@pytest.mark.parametrize("p, m", [(2, 2), (4, 4), (4, 8), (3, 7), (8, 32)])
def test_gpipe_and_1f1b_idle_the_closed_form_share(p, m):
    """Uniform stages, no latency: (p − 1) / (m + p − 1) (GPipe, Huang et al. 2019; PipeDream-Flush)."""
    for schedule in ("gpipe", "1f1b"):
        tl = simulate(schedule, p, m, forward_s=1.0, backward_s=2.0)
        assert tl.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        assert tl.step_s == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 6, 3), (4, 4, 2)])
def test_interleaving_divides_the_bubble_by_the_virtual_stages(p, m, v):
    """(p − 1) / (v·m + p − 1) (Narayanan et al. 2021, §2.2.2)."""
    tl = simulate("interleaved", p, m, v, forward_s=1.0, backward_s=2.0)
    assert tl.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("f, b, w", [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 1.2, 0.8)])
@pytest.mark.parametrize("p, m", [(4, 8), (4, 16), (8, 24)])
def test_zb_h1_idles_the_zero_bubble_papers_share(p, m, f, b, w):
    """(p − 1)(F + B − W) / (m(F + B + W) + (p − 1)(F + B − W)), B the input-gradient part (Qi et al. 2024)."""
    tl = simulate("zb-h1", p, m, forward_s=f, backward_s=b + w, weight_s=w)
    expected = (p - 1) * (f + b - w) / (m * (f + b + w) + (p - 1) * (f + b - w))
    assert tl.bubble_fraction == pytest.approx(expected, abs=1e-12)


def test_uneven_gpipe_stages_take_the_flow_shop_makespan():
    """m identical jobs through stages of times t_i take sum(t) + (m − 1)·max(t), forward then backward; the
    slow stage sets the pace (first and last stages lighter, as Llama 3 405B ran)."""
    f, b, m = [0.5, 1.0, 1.0, 0.7], [1.0, 2.5, 2.0, 1.5], 8
    tl = simulate("gpipe", 4, m, forward_s=f, backward_s=b)
    assert tl.step_s == pytest.approx(sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b))


def test_point_to_point_latency_lengthens_gpipe_by_two_crossings_per_hop():
    p, m, latency = 4, 6, 0.25
    tl = simulate("gpipe", p, m, forward_s=1.0, backward_s=2.0, p2p_s=latency)
    assert tl.step_s == pytest.approx((m + p - 1) * 3.0 + 2 * (p - 1) * latency)


def test_one_f_one_b_holds_fewer_micro_batches_than_gpipe():
    """Activation memory: GPipe keeps every micro-batch, 1F1B at most p − rank (PipeDream-Flush's point)."""
    assert simulate("gpipe", 4, 8).peak_in_flight == (8, 8, 8, 8)
    assert simulate("1f1b", 4, 8).peak_in_flight == (4, 3, 2, 1)


def test_the_orders_are_what_torch_runs_on_gloo_ranks(tmp_path):
    """Record forward_one_chunk / backward_one_chunk / backward_weight_one_chunk on 3 real ranks running torch's
    GPipe, 1F1B, interleaved 1F1B (2 chunks a rank) and zero-bubble (one stage a rank) schedules."""
    p, m, v = 3, 6, 2
    out = tmp_path / "order.json"
    script = Path(__file__).with_name("record_schedule_order.py")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(p),
            "--standalone",
            str(script),
            str(m),
            str(v),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in range(p):
        ran = json.loads(Path(f"{out}.rank{rank}").read_text())
        for schedule in ("gpipe", "1f1b", "interleaved", "zb-h1"):
            ours = [
                [a.kind, a.micro, a.stage]
                for a in rank_orders(schedule, p, m, v if schedule == "interleaved" else 1)[rank]
            ]
            assert ours == ran[schedule], f"{schedule}, rank {rank}"


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_replaying_a_timeline_recovers_its_step(schedule, v):
    """A run's timeline (here a simulated one with uneven stages and a send delay) replayed from its own chunk
    times and delays gives its step back: what `toolkit pipeline --run` does with a measured one."""
    n = 4 * v
    original = simulate(
        schedule,
        4,
        8,
        v,
        forward_s=[1.0 + 0.1 * i for i in range(n)],
        backward_s=[2.0 + 0.3 * i for i in range(n)],
        p2p_s=0.2,
    ).to_dict()
    again = replay(original)
    assert again.step_s == pytest.approx(original["step_s"], rel=1e-12)
    assert again.bubble_fraction == pytest.approx(original["bubble_fraction"], rel=1e-12)


def test_the_cli_prints_the_timeline_as_json(capsys):
    assert (
        main(["pipeline", "--stages", "4", "--microbatches", "8", "--schedule", "interleaved", "--vpp", "2", "--json"])
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["bubble_fraction"] == pytest.approx(3 / 19)
    assert result["step_s"] == pytest.approx(max(s["end_s"] for s in result["timeline"]))
    assert len(result["timeline"]) == 4 * 2 * 8 * 2  # ranks × chunks × micro-batches × (F, B)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--schedule", "1fb1"], "did you mean 1f1b"),
        (["--vpp", "2"], "needs the interleaved schedule"),
        (["--forward-s", "1,2,3"], "--forward-s needs one value per virtual stage (4)"),
        (["--schedule", "interleaved", "--vpp", "2", "--microbatches", "9"], "multiple of"),
        (["--weight-s", "3"], "cannot exceed"),
    ],
)
def test_bad_schedules_get_one_line(capsys, argv, says):
    base = {"--stages": "4", "--microbatches": "8"}
    args = dict(base, **dict(zip(argv[::2], argv[1::2])))
    assert main(["pipeline", *[x for kv in args.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_damaged_or_missing_run_timeline_gets_one_line(tmp_path, capsys):
    assert main(["pipeline", "--run", str(tmp_path)]) == 2
    assert "holds no pipeline timeline" in capsys.readouterr().err
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "rank0.json").write_text('{"stage": 0, "spans": [')  # cut mid-write
    assert main(["pipeline", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "rank0.json" in err and "not a readable pipeline timeline" in err and len(err.splitlines()) == 1
