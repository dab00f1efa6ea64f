"""The released models' facts: the paper's evaluation settings and architectures, the names the CLI offers."""

from __future__ import annotations

from transformer_xl.interop.tf_released import GENERIC_LENGTHS, PROJ_SAME_DIM, RELEASED, lengths_for


def test_the_released_models_carry_the_papers_evaluation_settings() -> None:
    assert lengths_for("wt103") == {"tgt_len": 128, "mem_len": 1600, "clamp_len": 1000, "same_length": True}
    assert lengths_for("enwik8") == lengths_for("text8") == {"tgt_len": 128, "mem_len": 3800, "clamp_len": 1000,
                                                             "same_length": True}
    assert lengths_for("lm1b") == {"tgt_len": 32, "mem_len": 128, "clamp_len": -1, "same_length": True}
    assert {r.paper for r in RELEASED.values()} == {0.99, 1.08, 18.3, 21.8}
    assert lengths_for("ptb") == GENERIC_LENGTHS


def test_the_cli_names_the_released_models_the_converter_knows() -> None:
    from transformer_xl.cli.convert import RELEASED_NAMES

    assert sorted(RELEASED_NAMES) == sorted(RELEASED)


def test_the_released_architectures_are_the_papers_model_sizes() -> None:
    """enwik8 and text8 large: 277M parameters as the paper's Table 2-3; One Billion Word large about 0.8B."""
    sizes = {name: r.config().parameter_count() / 1e6 for name, r in RELEASED.items()}
    assert round(sizes["enwik8"]) == round(sizes["text8"]) == 277 and 800 < sizes["lm1b"] < 850
    assert set(PROJ_SAME_DIM) == set(RELEASED) and not PROJ_SAME_DIM["lm1b"]
