"""Parameter counts: exact where a checkpoint's count is published, near the paper's size name otherwise."""

import pytest

from toolkit.estimate import count_params
from toolkit.specs import load_catalog

PRESETS = list(load_catalog().presets.values())


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_matches_published_count(preset):
    counted = count_params(preset.model).total
    error = abs(counted / preset.params_published - 1)
    # Exact checkpoint counts must agree within 0.5 % (ours agree to the parameter); a paper's
    # size name ("350M", "2.7B") is itself rounded, so it only bounds the count to 2 %.
    assert error < (0.005 if preset.params_published_kind == "exact" else 0.02), (counted, preset.params_published)


@pytest.mark.parametrize(
    "name, exact",
    [
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
        ("bert-large", 335_141_888),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
    ],
)
def test_exact_counts_to_the_parameter(catalog, name, exact):
    assert count_params(catalog.preset(name).model).total == exact


def test_parts_add_up_and_tied_head_is_free(catalog):
    model = catalog.preset("gpt2").model
    c = count_params(model)
    assert c.head == 0
    untied = count_params(model.replace(tie_embeddings=False))
    assert untied.total - c.total == model.hidden * model.vocab
    assert c.total == c.embedding + c.positions + c.layers + c.final


def test_gqa_shrinks_attention(catalog):
    llama = catalog.preset("llama2-7b").model
    mha, gqa = count_params(llama).per_layer, count_params(llama.replace(kv_heads=8)).per_layer
    # k and v projections shrink from h x h to h x h/4 each.
    assert mha - gqa == 2 * llama.hidden * (llama.hidden - llama.hidden // 4)


def test_size_only_model():
    from toolkit.specs import ModelSpec

    assert count_params(ModelSpec(params=7_000_000_000)).total == 7_000_000_000
