"""Our estimates against published figures, with the error of each.

    .venv/bin/python benchmarks/published_checks.py

Headline figures are printed last, one per line, as `name: value`.
"""

from toolkit.estimate import PF_DAY_FLOPS, count_params, training_flops
from toolkit.specs import load_catalog


def main() -> None:
    catalog = load_catalog()
    exact_errors, rounded_errors = [], []
    print(f"{'preset':<14} {'ours':>18} {'published':>18} {'kind':>8} {'error':>8}")
    for preset in catalog.presets.values():
        ours = count_params(preset.model).total
        error = 100 * (ours / preset.params_published - 1)
        (exact_errors if preset.params_published_kind == "exact" else rounded_errors).append(abs(error))
        print(
            f"{preset.name:<14} {ours:>18,} {int(preset.params_published):>18,} "
            f"{preset.params_published_kind:>8} {error:>+7.2f}%"
        )

    gpt3 = catalog.preset("gpt3-175b").model
    flops = training_flops(gpt3, count_params(gpt3).total, 300e9)
    flops_error = 100 * (flops.flops_6nd / 3.14e23 - 1)
    pf_days_error = 100 * (flops.flops_6nd / PF_DAY_FLOPS / 3640 - 1)
    print(
        f"\nGPT-3 175B, 300B tokens: 6ND = {flops.flops_6nd:.4e} FLOPs (paper 3.14e23), "
        f"{flops.flops_6nd / PF_DAY_FLOPS:,.0f} PF-days (paper 3640); with causal attention "
        f"{flops.total_flops:.4e} (+{100 * flops.attention_flops / flops.flops_6nd:.2f} %)\n"
    )
    print(f"max exact-count error: {max(exact_errors):.3f} %")
    print(f"max rounded-name error: {max(rounded_errors):.2f} %")
    print(f"gpt3 6nd flops error: {flops_error:+.2f} %")
    print(f"gpt3 pf-days error: {pf_days_error:+.2f} %")


if __name__ == "__main__":
    main()
