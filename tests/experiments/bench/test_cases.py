"""The benchmark's cases are the configurations it says it times."""

from __future__ import annotations

from transformer_xl.experiments.bench import CASES, bench_case


def test_cases_are_the_issue_configs() -> None:
    char, word = bench_case("char"), bench_case("word")
    assert (char.config.n_layer, char.config.d_model, char.config.n_token, char.batch_size) == (4, 256, 204, 8)
    assert (char.config.tgt_len, char.config.mem_len) == (128, 128)
    assert (word.config.n_token, word.config.cutoffs, word.config.div_val) == (33278, (2000, 10000), 4)
    assert {"enwik8-base", "wt103-base"} <= set(CASES)


def test_char_mid_is_the_mid_size_model() -> None:
    mid = bench_case("char-mid")
    cfg = mid.config
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner, mid.batch_size) == (6, 512, 8, 64, 2048, 4)
    assert (cfg.tgt_len, cfg.mem_len) == (256, 256)


def test_wt2_cpu_is_the_demo_model() -> None:
    from transformer_xl.model.presets import model_preset
    from transformer_xl.train.presets import train_demo

    case, demo = bench_case("wt2-cpu"), train_demo()
    assert case.config == model_preset(demo.model, 33278, **demo.model_overrides)  # WikiText-2's words
    assert case.batch_size == demo.batch_size
