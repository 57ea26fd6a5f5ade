"""Plain-text reports of serving: an inference estimate and a serving plan, as the CLI prints them."""

from __future__ import annotations

__all__ = ["render_serving", "render_serving_plan"]

GIB = 2**30


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _load(s: dict) -> str:
    """The load the figures are for: a Poisson rate or a number in flight."""
    load = s.get("load") or {}
    return f"{load['rate']:g} a second (Poisson)" if load.get("mode") == "rate" else f"{s['concurrency']} at a time"


def _experts(par: dict) -> str:
    """Expert parallelism's part of the layout line: experts over ep devices, attention data parallel across them."""
    ep = par.get("ep") or 1
    return f" · ep {ep} (attention dp {ep // par['tp']})" if ep > 1 else ""


def render_serving(est: dict) -> str:
    s, mem, cost, job = est["serving"], est["memory"], est["cost"], est["job"]
    cl, par = job["cluster"], job["parallel"]
    lines = [
        f"{est['model']['name'] or 'model'} served on {cl['count']} × {cl['accelerator']} (tp {par['tp']} · pp "
        f"{par['pp']}{_experts(par)} · {s['replicas']} replica(s)), weights {s['weights']} ({s['weight_bits']:.2f} bits), KV cache "
        f"{s['kv_dtype']}",
        f"requests: {_load(s)}, {s['input_tokens']} prompt + {s['output_tokens']} new tokens "
        f"(context {s['max_context']})",
        "",
        "memory a device",
        f"  weights          {mem['weights_bytes'] / GIB:8.2f} GiB",
        f"  KV cache         {mem['kv_cache_bytes'] / GIB:8.2f} GiB  ({s['kv_bytes_per_token'] / 1024:.0f} KiB a token; "
        f"the engine reserves {s['kv_blocks']} blocks = {s['kv_pool_bytes'] / GIB:.1f} GiB)",
        f"  activations      {mem['activation_bytes'] / GIB:8.2f} GiB",
        f"  runtime          {mem['runtime_bytes'] / GIB:8.2f} GiB  (CUDA context, workspaces, communicators)",
        f"  free             {mem['free_bytes'] / GIB:8.2f} GiB of {mem['capacity_bytes'] / GIB:.0f}",
        f"  fits: {'yes' if mem['fits'] else 'NO'} — at most {s['max_concurrency']} requests at {s['max_context']} "
        "tokens",
        "",
        f"speed a replica under load ({_load_words(s.get('load'))}, modelled)",
        f"  time to first token    {_ms(s['ttft_s'])} mean, p50 {_ms(s.get('ttft_s_p50'))}, p99 "
        f"{_ms(s.get('ttft_s_p99'))}  (alone: {_ms(s['prefill_s'])}){_range(s.get('ttft_s_range'))}",
        f"  time per output token  {_ms(s['tpot_s'])} mean, p50 {_ms(s.get('tpot_s_p50'))}, p99 "
        f"{_ms(s.get('tpot_s_p99'))}{_range(s.get('tpot_s_range'))}",
    ]
    if s["output_tokens_per_s"] is not None:
        lines += [
            f"  output tokens/s        {s['output_tokens_per_s']:.0f}",
            f"  requests/s             {s['requests_per_s']:.2f}",
        ]
    if cost.get("usd_per_million_output_tokens") is not None:
        kind = "spot" if cost["spot"] else "on demand"
        lines += [
            "",
            f"cost on {cost['offer']} ({kind}, the devices used)",
            f"  per million output tokens  ${cost['usd_per_million_output_tokens']:.3f}",
            f"  per million input tokens   ${cost['usd_per_million_input_tokens']:.3f}  (the prompts' share of each "
            "step)",
        ]
    if s["curve"]:
        lines += ["", "throughput-latency curve", f"  {'requests':>8} {'TTFT':>10} {'TPOT':>10} {'tokens/s':>10}"]
        for p in s["curve"]:
            lines.append(
                f"  {p['concurrency']:8d} {_ms(p['ttft_s']):>10} {_ms(p['tpot_s']):>10} {p['output_tokens_per_s']:10.0f}"
            )
    lines += ["", *(f"note: {n}" for n in est["notes"])]
    return "\n".join(lines)


def render_serving_plan(result: dict) -> str:
    target = result["target"]
    order = "$/h for the load" if " requests/s" in target or "tokens/s" in target else "$/M output tokens"
    lines = [f"serving plans for {target}, cheapest first by {order} ({result['evaluated']} evaluated)"]
    head = f"  {'offer':<16}{'weights':<8}{'tp':>3}{'replicas':>10}{'devices':>8}{'req.':>6}{'TTFT':>10}{'TPOT':>10}"
    simulated = any(p.get("simulated") for p in result["plans"])
    lines.append(
        head + f"{'tokens/s':>10}{'$/h':>9}{'$/M out':>9}" + (f"{'TTFT p99':>10}{'TPOT p99':>10}" if simulated else "")
    )
    for p in result["plans"]:
        sim = p.get("simulated") or {}
        lines.append(
            f"  {p['offer']:<16}{p['weights']:<8}{p['tp']:>3}{_replicas(p):>10}{p['devices']:>8}{p['concurrency']:>6}"
            f"{_ms(p['ttft_s']):>10}{_ms(p['tpot_s']):>10}{p['output_tokens_per_s']:>10.0f}{p['usd_per_hour']:>9.2f}"
            f"{p['usd_per_million_output_tokens']:>9.3f}"
            + (f"{_ms(sim['ttft_s_p99']):>10}{_ms(sim['tpot_s_p99']):>10}" if sim else "")
        )
    if not result["plans"]:
        lines.append("  none meets the target: " + "; ".join(result["why_none"]))
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def _replicas(plan: dict) -> str:
    """Replicas, or disaggregated prefill:decode workers (P+D)."""
    split = plan.get("disaggregated")
    return f"{split['prefill_workers']}P+{split['decode_workers']}D" if split else str(plan["replicas"])


def _load_words(load: dict | None) -> str:
    """The simulated load in a few words."""
    if not load:
        return "no speed figures"
    where = f"{load['rate']:g} requests/s, Poisson" if load["mode"] == "rate" else f"{load['concurrency']} in flight"
    saturated = "; SATURATED: the queue grows" if load.get("saturated") else ""
    return f"{where}, {load['engine']}'s scheduler, {load['requests']} requests simulated{saturated}"


def _range(bounds: list | None) -> str:
    """Where published runs fell around such a figure (toolkit.estimate.band.serving_range)."""
    return "" if not bounds else f"; published runs fell {_ms(bounds[0])}–{_ms(bounds[1])}"
