"""Human-readable text for estimates and catalog rows (the CLI's non-JSON output)."""

from __future__ import annotations

from ..specs.axes import AXES

__all__ = ["gib", "count", "sci", "money", "render_estimate", "render_pipeline", "layout_text"]


def gib(n_bytes: float | None) -> str:
    """Bytes in binary units, GiB from 1 GiB up, MiB below (small models read as something)."""
    if n_bytes is None:
        return "—"
    if abs(n_bytes) >= 2**30 or n_bytes == 0:
        return f"{n_bytes / 2**30:,.1f} GiB"
    return f"{n_bytes / 2**20:,.1f} MiB"


def count(n: float | None) -> str:
    if n is None:
        return "—"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{n:g}"


def sci(x: float | None) -> str:
    return "—" if x is None else f"{x:.3e}"


def money(amount: float | None, currency: str | None) -> str:
    return "—" if amount is None else f"{amount:,.0f} {currency}"


def _rows(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"{indent}{k:<{width}}  {v}" for k, v in rows]


_PART_NAMES = {
    "compute_s": "compute",
    "memory_bound_s": "memory-bound",
    "overhead_s": "per-op overhead",
    "tp_comm_s": "tp comm",
    "cp_comm_s": "cp ring",
    "ep_comm_s": "ep all-to-all",
    "dp_comm_exposed_s": "dp comm (exposed)",
    "pp_comm_s": "pp sends",
    "bubble_s": "bubble",
    "optimizer_s": "optimizer",
}


def render_estimate(est: dict) -> str:
    """The CLI's report of one estimate: one block per section, each built by its own helper."""
    if est.get("workload") == "inference":
        from .text_serving import render_serving

        return render_serving(est)
    out = _header_lines(est)
    out += ["", "memory per device (busiest)"] + _memory_lines(est["memory"])
    out += ["", "compute"] + _compute_lines(est["compute"])
    out += _time_lines(est["time"])
    out += _cost_lines(est["cost"])
    out += _energy_lines(est["cost"])
    if est["notes"]:
        out += ["", "notes"] + [f"  - {n}" for n in est["notes"]]
    return "\n".join(out)


def _layout_line(par: dict) -> str:
    """The parallel layout in one line; axes left at 1 are not named."""
    return (
        f"dp {par['dp']} · tp {par['tp']} · pp {par['pp']}"
        + (f" · vpp {par['vpp']}" if par["vpp"] > 1 else "")
        + (f" · cp {par['cp']}" if par.get("cp", 1) > 1 else "")
        + (f" · ep {par['ep']}" if par.get("ep", 1) > 1 else "")
        + (f" · etp {par['etp']}" if par.get("etp", 1) > 1 else "")
        + (" · sp" if par["sp"] else "")
        + (f" · HSDP ({par['dp_replicate']} copies)" if par.get("dp_replicate", 1) > 1 else "")
    )


def _header_lines(est: dict) -> list[str]:
    """What was estimated: the model, the devices and their layout, the batch."""
    job, model = est["job"], est["model"]
    par, cl = job["parallel"], job["cluster"]
    batch, seq = job["batch"], job["model"]["seq_len"]
    device = f"{cl['count']} × {cl['accelerator']}" if cl["accelerator"] else f"{cl['count']} device(s), no accelerator"
    active = model.get("active_params")
    accum = batch["global_batch"] // (batch["micro_batch"] * par["dp"])
    return [
        f"{model['name'] or 'model'}: {count(model['params'])} parameters ({model['params']:,})"
        + (f", {count(active)} active per token" if active and active != model["params"] else ""),
        f"  {device}  [{_layout_line(par)}]  {job['precision']['mode']} · {job['optimizer']['name']} · ZeRO-{par['zero']}"
        + (f" · offload {par['offload']}" if par["offload"] != "none" else ""),
        f"  batch {batch['global_batch']} sequences × {seq} tokens = {count(batch['global_batch'] * seq)} tokens/step "
        f"(micro-batch {batch['micro_batch']}, {accum} accumulation step{'s' if accum > 1 else ''})",
    ]


def _device_term_rows(mem: dict) -> list[tuple[str, str]]:
    """Allocator and device-level terms above the tensors, when the estimate has them."""
    t = mem.get("device_terms")
    if not t:
        return []
    return [
        (
            "reserved (allocator)",
            f"{gib(mem['reserved_peak_bytes'])} (+{gib(t['fragmentation_bytes'])} "
            f"fragmentation{', expandable segments' if mem.get('expandable_segments') else ''}, "
            f"+{gib(t['workspace_bytes'])} workspaces)",
        ),
        (
            "on the device",
            f"{gib(mem['device_peak_bytes'])} (+{gib(t['context_bytes'])} CUDA context, "
            f"+{gib(t['comm_bytes'])} communication buffers): what nvidia-smi shows",
        ),
    ]


def _memory_lines(mem: dict) -> list[str]:
    """Memory per device: the model states, activations, the peak and whether it fits."""
    fits = {True: "fits", False: "does NOT fit", None: "fit unknown: activations need the model's shape"}[mem["fits"]]
    peak = (
        "—"
        if mem["peak_bytes"] is None
        else f"{gib(mem['peak_bytes'])}" + (f" (at {mem['peak_phase']})" if mem.get("peak_phase") else "")
    )
    capacity = f"{gib(mem['device_bytes'])} ({gib(mem['usable_bytes'])} usable): {fits}" if mem["device_bytes"] else "—"
    return _rows(
        [
            ("parameters", gib(mem["params_bytes"])),
            ("gradients", gib(mem["grads_bytes"])),
            ("optimizer states", gib(mem["optimizer_bytes"])),
            ("model states", gib(mem["states_bytes"])),
            ("activations", "not modelled yet" if mem["activations_bytes"] is None else gib(mem["activations_bytes"])),
            ("peak in a step", peak),
            *_device_term_rows(mem),
            ("offloaded to host", gib(mem["host_bytes"])),
            *_host_rows(mem),
            ("device capacity", capacity),
        ]
    )


def _host_rows(mem: dict) -> list[tuple[str, str]]:
    """A node's offloaded states against its RAM, where states are offloaded."""
    if not mem.get("host_bytes_per_node"):
        return []
    where = {"given": "given", "offer": "the offer's", "accelerator": "reference system's", "assumed": "assumed"}
    return [
        (
            "host memory a node",
            f"{gib(mem['host_bytes_per_node'])} of {gib(mem['host_usable_bytes_per_node'])} usable "
            f"({where.get(mem.get('host_memory_source'), '')} RAM)",
        )
    ]


def _compute_lines(comp: dict) -> list[str]:
    """Training FLOPs: 6·N·D, attention, every matmul, and with recompute when it differs."""
    if comp["flops_6nd"] is None:
        return ["  no token budget (--tokens)"]
    rows = [
        ("6·N·D", f"{sci(comp['flops_6nd'])} FLOPs = {comp['pf_days_6nd']:,.0f} PF-days"),
        ("attention", f"{sci(comp['attention_flops'])} FLOPs ({comp['attention_convention']})"),
        (
            "model FLOPs",
            f"{sci(comp['total_flops'])} = "
            + ("—" if comp["pf_days"] is None else f"{comp['pf_days']:,.0f} PF-days")
            + (" (every matmul, attention included)" if comp.get("model_flops_per_token") else ""),
        ),
    ]
    if comp.get("hardware_flops") and comp["hardware_flops"] != comp["total_flops"]:
        rows.append(("with recompute", f"{sci(comp['hardware_flops'])} (what HFU counts)"))
    return _rows(rows)


def _time_heading(time: dict) -> str:
    """The time section's title: the peak it is measured against and where the MFU came from."""
    peak = (
        "unknown" if time["peak_flops_per_device"] is None else f"{time['peak_flops_per_device'] / 1e12:,.1f} TFLOP/s"
    )
    given = time["mfu_source"] == "given"
    mfu = (
        f", time to train at the given MFU {time['mfu']:.1%}: --mfu; the step below is modelled apart)"
        if time["mfu"] is not None and given
        else f", MFU {time['mfu']:.1%} modelled)"
        if time["mfu"] is not None
        else ", no MFU given)"
    )
    return f"time ({time['dtype']} peak " + peak + mfu


def _step_rows(time: dict) -> list[tuple[str, str]]:
    """The modelled step, its parts, its likely range and the throughput it gives."""
    parts = ", ".join(f"{_PART_NAMES[k]} {v:.3g}" for k, v in time["breakdown"].items() if v > 0)
    low, high = time.get("step_s_range") or (time["step_s"], time["step_s"])
    return [
        ("step (modelled)", f"{time['step_s']:.3g} s = {parts} (s)"),
        (
            "likely range",
            f"{low:.3g}–{high:.3g} s ({_RANGE_WORDS.get(time.get('step_s_regime'), 'held-out runs')}, "
            f"{time.get('step_s_regime')} regime)",
        ),
        (
            "throughput",
            f"{time['tokens_per_s']:,.0f} tokens/s, modelled MFU {time['mfu_modelled']:.1%}, "
            f"HFU {time['hfu_modelled']:.1%}, matmul efficiency "
            f"{time['gemm_efficiency']:.0%} of peak",
        ),
    ]


def _time_lines(time: dict) -> list[str]:
    """Step time, then time to train (or per 1B tokens when there is no budget)."""
    out = ["", _time_heading(time)]
    if time["step_s"] is not None:
        out += _rows(_step_rows(time))
    if time["train_s"] is None and time.get("tokens_per_s"):
        per_billion_h = 1e9 / time["tokens_per_s"] / 3600
        note = "(no token budget given: --tokens, or --dataset-tokens for a fine-tune)"
        out += _rows([("per 1B tokens", f"{per_billion_h:,.1f} h " + note)])
    elif time["train_s"] is None:
        out += ["  —"]
    else:
        out += _rows(
            [
                ("time to train", f"{time['train_days']:,.1f} days ({time['train_s'] / 3600:,.0f} h)"),
                ("device-hours", f"{time['device_hours']:,.0f}"),
            ]
        )
    return out


def _cost_lines(cost: dict) -> list[str]:
    """The price of the run on the chosen offer, with spot interruptions when modelled."""
    if not cost["offer"]:
        return []
    kind = "spot (high end of range)" if cost["spot"] else "on-demand"
    price = "price unknown" if cost["price_per_hour"] is None else f"{cost['price_per_hour']:,} {cost['currency']}/h"
    out = ["", f"cost on {cost['offer']} ({cost['instances']} instance(s) × {price}, {kind})"]
    line = money(cost["amount"], cost["currency"])
    if cost["amount_spot_low"] is not None:
        line += f" (low end of the spot range: {money(cost['amount_spot_low'], cost['currency'])})"
    out += [f"  {line}"]
    run = cost.get("spot_run")
    if run:
        out += [
            f"  with interruptions: {money(run['amount'], cost['currency'])} — about {run['interruptions']:.1f} "
            f"interruptions, +{run['overhead_fraction']:.1%} wall time, a checkpoint every "
            f"{run['interval_s'] / 60:,.0f} min ({run['checkpoint_write_s']:.0f} s to write; Young/Daly)"
        ]
    return out


def _energy_lines(cost: dict) -> list[str]:
    """Energy of the run, its price and CO2 when given."""
    energy = cost.get("energy")
    if not energy:
        return []
    line = f"  energy {energy['kwh']:,.0f} kWh (accelerators at TDP × PUE {energy['pue']:g})"
    if energy["amount"] is not None:
        line += f", {energy['amount']:,.0f} at your price"
    if energy["co2_kg"] is not None:
        line += f", {energy['co2_kg'] / 1000:,.1f} t CO2"
    return ["", line]


def render_comparison(cmp: dict) -> str:
    """Estimate vs trace per memory category, with the relative error."""
    model = cmp["job"]["model"]["name"] or "model"
    out = [f"{model}: analytic estimate vs trace ({cmp['program']} program), per device", ""]
    out.append(f"  {'':<18}{'estimate':>14}{'trace':>14}{'error':>10}")
    for key, row in cmp["memory"].items():
        error = "—" if row["error"] is None else f"{100 * row['error']:+.2f} %"
        est = "not modelled" if row["estimate"] is None else gib(row["estimate"])
        traced = "not measured" if row["trace"] is None else gib(row["trace"])
        out.append(f"  {key.replace('_bytes', ''):<18}{est:>14}{traced:>14}{error:>10}")
    flops = cmp.get("flops_per_token")
    if flops and flops["trace"]:
        est = "eager only" if flops["estimate"] is None else sci(flops["estimate"])
        error = "—" if flops["error"] is None else f"{100 * flops['error']:+.2f} %"
        out.append(f"  {'FLOPs per token':<18}{est:>14}{sci(flops['trace']):>14}{error:>10}")
    return "\n".join(out)


def render_run_comparison(cmp: dict) -> str:
    """A run's measured memory per rank beside the estimate and the trace, and its step time."""
    out = [f"{cmp['run']}: estimate, trace and measured tensor memory per rank", ""]
    out.append(f"  {'rank':<6}{'stage':<7}{'estimate':>12}{'trace':>12}{'measured':>12}{'error':>10}")
    for row in cmp["ranks"]:
        peak = row["peak_bytes"]
        error = "—" if peak["error"] is None else f"{100 * peak['error']:+.2f} %"
        traced = "—" if peak["trace"] is None else gib(peak["trace"])
        out.append(
            f"  {row['rank']:<6}{row['stage']:<7}{gib(peak['estimate']):>12}{traced:>12}"
            f"{gib(peak['measured']):>12}{error:>10}"
        )
    if not cmp["ranks"]:
        out.append("  (no memory/rank*.json yet: the run records its first two steps)")
    elif cmp["ranks"][0]["instrument"]:
        out.append(f"  measured with {cmp['ranks'][0]['instrument']}, steps {cmp['ranks'][0]['steps']}")
    if cmp.get("trace_note"):
        out.append(f"  trace: not run ({cmp['trace_note']})")
    step = cmp["time"]["step_s"]
    if step["measured"] is not None:
        error = "" if step["error"] is None else f" ({100 * step['error']:+.1f} %)"
        modelled = (
            f"modelled {step['estimate']:.3f} s{error}"
            if step["estimate"] is not None
            else "no modelled step: this device has no catalog row (`toolkit calibrate --out profile.yaml`, "
            "then --catalog profile.yaml)"
        )
        out.append(f"  step time     measured {step['measured']:.3f} s (median, after the recorded steps); {modelled}")
    return "\n".join(out)


_RANGE_WORDS = {
    "kernel_profile": "80 % of steps on a stack the model has not seen",
    "run_calibrated": "80 % of steps predicted from one measured step of their stack",
    "calibrated": "where this machine's calibrated runs fell",
    "assumed": "no measured run: ±50 %",
}
"""What a likely range means, by the regime of its band (toolkit.estimate.band)."""


def layout_text(layout: dict) -> str:
    """A plan's layout in one line: dp, then each axis of toolkit.specs.axes that says something."""
    parts = [f"dp {layout['dp']}"]
    parts += [part for axis in AXES if (part := axis.text(layout.get(axis.name, axis.default))) is not None]
    return " · ".join(parts)


def plan_layout_text(plan: dict) -> str:
    """A plan's layout, with the MoE dispatcher and overlap the search chose where experts are spread (ep > 1)."""
    text, moe = layout_text(plan["layout"]), plan.get("moe")
    if moe and plan["layout"].get("ep", 1) > 1:
        text += f" · {moe['dispatcher']}" + (" · ep overlap" if moe["overlap_ep_comm"] else "")
    return text


def duration_text(seconds: float) -> str:
    """A step or a run in the unit that reads: ms below a second, minutes below an hour, hours below two days."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:,.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:,.1f} days"


_NETWORK_SOURCE = {
    "given": "the job's or its offer's",
    "accelerator": "the accelerator's reference system",
    "assumed": "assumed: give --offer or cluster.inter_node_bw_bytes_per_s",
}


def plan_assumptions(result: dict) -> list[str]:
    """What the plans were priced with: the token budget, the network across nodes and its source, the MFU."""
    if not result["plans"]:
        return []
    best = result["plans"][0]
    net = best.get("network") or {}
    budget = (
        f"per {best['tokens']:.3g} tokens (a fine-tune with no budget given: --tokens or --dataset-tokens)"
        if result.get("per_billion_tokens")
        else f"token budget {best['tokens']:.3g} tokens"
    )
    lines = [f"  {budget}; MFU modelled by the step-time model (not given)"]
    if best["devices"] > 8 and net:
        lines.append(
            f"  network across nodes {net['gbps_per_device']:.0f} Gb/s per device ({_NETWORK_SOURCE[net['source']]})"
        )
    if len(result["plans"]) > 1:
        second = result["plans"][1]
        parts = {k: second["breakdown"][k] - best["breakdown"][k] for k in best["breakdown"]}
        name, diff = max(parts.items(), key=lambda kv: abs(kv[1]))
        if abs(diff) < 1e-3 * best["step_s"]:
            lines.append("  #1 against #2: the same modelled step (ties keep the search's order)")
        else:
            lines.append(
                f"  #1 against #2: #2's {_PART_NAMES.get(name, name)} is {duration_text(abs(diff))} "
                f"{'longer' if diff > 0 else 'shorter'} a step (the largest difference of their steps' parts)"
            )
    return lines


def render_plan(result: dict) -> str:
    out = [f"evaluated {result['evaluated']:,} layouts, {result['fitting']:,} fit; best by {result['objective']}:"]
    out += plan_assumptions(result)
    if not result["plans"]:
        out.append("  none fits: try more devices (--max-gpus), another accelerator, or see `toolkit doctor`")
    head = ("#", "devices", "layout", "device peak/usable", "step", "MFU", "time to train", "cost")
    rows = [head]
    for i, p in enumerate(result["plans"], 1):
        where = f"{p['devices']}x{p['accelerator']}" + (f" ({p['instances']}x {p['offer']})" if p["offer"] else "")
        chance = p.get("beats_best_probability")
        mark = f"≈ ({chance:.0%})" if p.get("within_error") and i > 1 and chance is not None else ""
        rows.append(
            (
                f"{i}{mark}",
                where,
                plan_layout_text(p),
                f"{gib(p['device_peak_bytes'])}/{gib(p['usable_bytes'])}",
                duration_text(p["step_s"]),
                f"{p['mfu']:.0%}",
                duration_text(p["train_days"] * 86400),
                money(p["cost"], p["currency"]) if p["cost"] is not None else "—",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if any(p.get("within_error") for p in result["plans"][1:]):
        out.append(
            "  ≈ (P) within the model's error of #1: P is the chance it is in fact the better of the two, from the "
            "error two layouts of one stack do not share; measure before trusting the order"
        )
    simulated = [
        (i, p["pipeline"]) for i, p in enumerate(result["plans"], 1) if (p.get("pipeline") or {}).get("simulated_s")
    ]
    if simulated:
        out.append(
            "  pipelines, closed form against the schedule simulator: "
            + "; ".join(
                f"#{i} {pipe['closed_form_s']:.2f} vs {pipe['simulated_s']:.2f} s (bubble {pipe['bubble_fraction']:.0%})"
                for i, pipe in simulated[:5]
            )
        )
    if result["pareto"]:
        out += ["", "Pareto front (no plan is both faster and cheaper):"]
        out += [
            f"  {p['train_days']:,.1f} days, {money(p['cost'], p['currency'])}: {p['devices']}x{p['accelerator']}, "
            f"{plan_layout_text(p)}"
            for p in result["pareto"]
        ]
    if result["refused_clusters"]:
        out += ["", "not tried:"] + [f"  - {r}" for r in result["refused_clusters"]]
    return "\n".join(out)


def render_doctor(result: dict) -> str:
    if "fixes" not in result:  # a run's diagnosis
        return "\n".join([f"run of {result['steps']} steps:"] + [f"  - {f}" for f in result["findings"]])
    state = "fits" if result["fits"] else "does NOT fit"
    out = [
        f"device peak {gib(result['device_peak_bytes'])} (tensors {gib(result['peak_bytes'])}) of "
        f"{gib(result['usable_bytes'])} usable: {state}"
        + (f"; step {result['step_s']:.3g} s (modelled)" if result["step_s"] is not None else "")
    ]
    out += [f"  - {f}" for f in result["findings"]]
    if result["fixes"]:
        out += ["", "changes, best first:" if result["fits"] else "changes that make it fit come first:"]
        for f in result["fixes"][:12]:
            time = "" if f["step_change"] is None else f", step {f['step_change']:+.0%}"
            mark = "fits" if f["fits"] else "still over"
            out.append(
                f"  {f['change']}: {gib(result['device_peak_bytes'])} -> {gib(f['device_peak_bytes'])} per device "
                f"({mark}{time})"
            )
    elif result["fits"]:
        out += ["", "no single change makes it faster"]
    combined = result.get("combined")
    if combined:
        time = "" if combined["step_change"] is None else f", step {combined['step_change']:+.0%}"
        verdict = "fits" if combined["fits"] else "still does not fit: more devices or a larger accelerator"
        out += [
            "",
            f"no single change fits; together: {' + '.join(combined['changes'])}",
            f"  -> {gib(combined['device_peak_bytes'])} per device ({verdict}{time})",
        ]
    return "\n".join(out)


def render_pipeline(tl: dict, width: int = 96) -> str:
    """A simulated schedule (Timeline.to_dict()): its figures, then one text row per rank, F/B/W for the
    operation at each instant (lower case for odd micro-batches, so neighbours stay apart) and '.' for idle."""
    p, m, v = tl["stages"], tl["microbatches"], tl["vpp"]
    lines = [
        f"{tl['schedule']}: {p} stages, {m} micro-batches"
        + (f", vpp {v}" if v > 1 else "")
        + f" · step {tl['step_s']:.4g} s · bubble {tl['bubble_fraction']:.1%} (idle / stages × step)",
        "peak micro-batch chunks in flight per rank: " + " ".join(str(n) for n in tl["peak_in_flight"]),
    ]
    cell_s = tl["step_s"] / width if tl["step_s"] > 0 else 1.0
    for rank in range(p):
        row = ["."] * width
        for s in (s for s in tl["timeline"] if s["rank"] == rank):
            first, last = int(s["start_s"] / cell_s + 0.5), int(s["end_s"] / cell_s + 0.5)
            for col in range(first, min(max(last, first + 1), width)):
                row[col] = s["kind"] if s["micro"] % 2 == 0 else s["kind"].lower()
        lines.append(f"rank {rank:<3} |{''.join(row)}|")
    return "\n".join(lines)
