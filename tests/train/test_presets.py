"""Training presets: the official run scripts' settings, as functions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_xl import TransformerXLLM
from transformer_xl.errors import ConfigError
from transformer_xl.model import presets as model_presets
from transformer_xl.model.presets import model_preset
from transformer_xl.train import presets as train_presets
from transformer_xl.train.config import TrainConfig
from transformer_xl.train.presets import TRAIN_PRESETS, train_preset

# script: (n_layer, d_model, n_head, d_head, d_inner, dropout, dropatt, div_val, warmup, max_step, tgt=mem,
#          eval_tgt_len, batch) from the official pytorch/run_*.sh
OFFICIAL = {
    "enwik8-base": (12, 512, 8, 64, 2048, 0.1, 0.0, 1, 0, 400_000, 512, 128, 22),
    "enwik8-large": (24, 1024, 8, 128, 3072, 0.15, 0.15, 1, 4000, 400_000, 768, 128, 64),
    "text8-base": (12, 512, 8, 64, 2048, 0.1, 0.0, 1, 0, 400_000, 512, 128, 22),
    "text8-large": (24, 1024, 8, 128, 3072, 0.15, 0.15, 1, 0, 400_000, 768, 128, 64),
    "wt103-base": (16, 410, 10, 41, 2100, 0.1, 0.0, 1, 0, 200_000, 150, 150, 60),
    "wt103-large": (18, 1024, 16, 64, 4096, 0.2, 0.2, 4, 16_000, 4_000_000, 384, 128, 128),
    "lm1b-base": (18, 1024, 8, 128, 4096, 0.0, 0.0, 4, 20_000, 500_000, 32, 32, 224),
    "lm1b-large": (24, 1280, 16, 80, 8192, 0.05, 0.05, 4, 30_000, 1_200_000, 32, 32, 512),
}


# eval.py settings of each script: (tgt_len, mem_len, clamp_len, same_length, batch)
OFFICIAL_EVAL = {
    "enwik8-base": (80, 2100, 820, True, 10), "text8-base": (80, 2100, 820, True, 10),
    "enwik8-large": (128, 3800, 1000, True, 10), "text8-large": (128, 3800, 1000, True, 10),
    "wt103-base": (64, 640, 400, True, 10), "wt103-large": (128, 1600, 1000, True, 10),
    "lm1b-base": (32, 128, -1, True, 64), "lm1b-large": (32, 128, -1, True, 8),
}


VOCAB = {"enwik8": 204, "text8": 27, "wt103": 267_735, "lm1b": 793_471}


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_paper_presets_are_the_official_scripts(name) -> None:
    cfg = train_preset(name)
    m = model_preset(cfg.model, VOCAB[cfg.dataset], **cfg.model_overrides)
    got = (m.n_layer, m.d_model, m.n_head, m.d_head, m.d_inner, m.dropout, m.dropatt, m.div_val, cfg.warmup_step,
           cfg.max_step, m.tgt_len, cfg.eval_tgt_len, cfg.batch_size)
    assert got == OFFICIAL[name]
    assert m.mem_len == m.tgt_len and m.ext_len == 0 and not m.same_length and m.clamp_len == -1
    assert (cfg.optim, cfg.lr, cfg.scheduler, cfg.eta_min, cfg.clip, cfg.seed) == ("adam", 2.5e-4, "cosine", 0.0,
                                                                                   0.25, 1111)
    assert (cfg.eval_interval, cfg.log_interval, cfg.eval_batch_size, cfg.batch_chunk) == (4000, 200, 10, 1)
    assert (cfg.test_tgt_len, cfg.test_mem_len, cfg.test_clamp_len, cfg.test_same_length,
            cfg.test_batch_size) == OFFICIAL_EVAL[name]
    if cfg.dataset in ("wt103", "lm1b"):
        assert m.cutoffs == ((20000, 40000, 200000) if cfg.dataset == "wt103" else (60000, 100000, 640000))


def test_ptb_is_labelled_as_our_own() -> None:
    assert "OUR OWN" in train_presets.train_ptb.__doc__ and "OUR OWN" in model_presets.ptb.__doc__
    with torch.device("meta"):
        n_params = TransformerXLLM(model_preset("ptb", 10000)).num_parameters()
    assert 22e6 < n_params < 26e6  # about the paper's 24M


@pytest.mark.parametrize("name", sorted(TRAIN_PRESETS))
def test_every_preset_builds_and_round_trips(name) -> None:
    cfg = train_preset(name)
    assert cfg.preset == name and TrainConfig.from_json(cfg.to_json()) == cfg
    model_preset(cfg.model, VOCAB.get(cfg.dataset, 33278), **cfg.model_overrides)


def test_unknown_preset_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'enwik8-large'"):
        train_preset("enwik8-larg")


def test_demo_is_wt2_cpu_capped_by_steps_with_a_final_evaluation() -> None:
    demo, wt2 = train_preset("demo"), train_preset("wt2-cpu")
    demo.validate()
    assert demo.max_step == 400 and demo.max_minutes is None and demo.final_eval
    assert demo.max_step % demo.eval_interval == 0 and demo.max_step % demo.save_interval == 0
    assert dataclasses.replace(demo, preset="wt2-cpu", max_step=wt2.max_step) == wt2
