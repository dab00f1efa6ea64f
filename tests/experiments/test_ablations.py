"""The ablations of paper Tables 6, 7 and 10 at toy sizes: variants, training through the Trainer, evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import tiny_config
from txl.data import Corpus, Vocab
from txl.errors import ConfigError
from txl.experiments import ablations as A

BASE = tiny_config(n_token=40, tgt_len=8, mem_len=8, init_std=0.02)


def test_variants_and_configs() -> None:
    assert len(A.TABLE6) == 9 and len({v.name for v in A.TABLE6}) == 9
    v = A.parse_variant("norec-alrfou-half")
    cfg = A.variant_config(BASE, v, 16)
    assert (cfg.attn_type, cfg.tgt_len, cfg.mem_len) == (3, 16, 0)
    rec = A.variant_config(BASE, A.parse_variant("rec-shaw-full"), 16)
    assert (rec.attn_type, rec.tgt_len, rec.mem_len) == (1, 16, 16)
    long = A.variant_config(BASE, A.TABLE10[2], 128)
    assert (long.tgt_len, long.mem_len) == (176, 0)
    assert A.parse_variant(A.TABLE10[3].name) == A.TABLE10[3]
    assert [v.name for v in A.TABLE7] == ["rec-ours-full", "rec-shaw-full", "norec-ours-full"]
    assert set(A.TABLE7) <= set(A.TABLE6)  # Table 7 reuses Table 6 runs on the same data
    for bad in ("rec-ours", "x-ours-full", "rec-bogus-full", "rec-ours-quarter"):
        with pytest.raises(ConfigError):
            A.parse_variant(bad)


def test_variants_train_through_the_trainer_with_the_half_loss(tmp_path) -> None:
    """A Half variant is a ``txl train`` run with ``half_loss``; an interrupted variant resumes from its run."""
    corpus = Corpus.from_arrays("toy", {"train": np.random.default_rng(0).integers(0, 40, 3000),
                                        "valid": np.random.default_rng(1).integers(0, 40, 300)}, n_token=40)
    cfg = A.variant_config(BASE, A.parse_variant("norec-ours-half"), 8)
    model, log = A.train_variant(cfg, corpus, tmp_path / "run", steps=4, batch_size=4, half_loss=True, warmup=1)
    run = json.loads((tmp_path / "run" / "config.json").read_text())
    assert run["train"]["half_loss"] is True and run["model"]["mem_len"] == 0 and run["model"]["attn_type"] == 0
    assert log["steps"] == 4 and [h["step"] for h in log["history"]] == [4] and not model.training
    # a longer run of the same variant continues from the checkpoint instead of starting over
    _, longer = A.train_variant(cfg, corpus, tmp_path / "run", steps=6, batch_size=4, half_loss=True, warmup=1)
    assert longer["steps"] == 6


def test_run_ablation_is_resumable_and_tabulates(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    corpus = Corpus.from_arrays("toy", {"train": rng.integers(0, 40, 3000), "valid": rng.integers(0, 40, 600)},
                                n_token=40)
    variants = [A.parse_variant("rec-ours-full"), A.parse_variant("norec-alrfou-half")]
    rows = A.run_ablation(BASE, corpus, tmp_path, variants, tgt_len=8, steps=3, attn_grid=[8, 16, 32],
                          batch_size=4)
    assert [r["variant"] for r in rows] == ["rec-ours-full", "norec-alrfou-half"]
    xl, van = rows
    assert xl["attn_len_init"] == 16 and van["attn_len_init"] == 8
    assert [t["attn_len"] for t in xl["tried"]] == [16, 32]  # init (8 + 8), then mem 24
    assert [t["attn_len"] for t in van["tried"]] == [8]  # attn_type 3 learned only 8 positions
    assert (tmp_path / "rec-ours-full" / "model.safetensors").is_file()
    assert Vocab.load(tmp_path / "rec-ours-full" / "vocab.json").sha256() == corpus.vocab.sha256()  # self-contained
    monkeypatch.setattr(A, "train_variant", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    again = A.run_ablation(BASE, corpus, tmp_path, variants, tgt_len=8, steps=3, attn_grid=[8, 16, 32])
    assert [r["ppl_best"] for r in again] == [r["ppl_best"] for r in rows]
    table = A.ablation_table(rows)
    assert "Al-Rfou et al. (2018)" in table and "✓" in table and "PPL best" in table
    assert "bpc best" in A.ablation_table(rows, char_level=True)




def test_a_signal_leaves_the_variant_unfinished_and_resumable(tmp_path, monkeypatch) -> None:
    """SIGTERM/Ctrl-C during a variant's training: no result is written (a re-run does not skip it), the
    interrupt reaches the caller, and the variant's run directory holds the checkpoint to resume from."""
    corpus = Corpus.from_arrays("toy", {"train": np.random.default_rng(0).integers(0, 40, 3000),
                                        "valid": np.random.default_rng(1).integers(0, 40, 300)}, n_token=40)
    from txl.train import Trainer

    train_step = Trainer.train_step

    def signalled(self, *args, **kwargs):
        if self.step == 2:
            self.stop_request = "signal"  # what the SIGTERM handler does
        return train_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", signalled)
    variant = [A.parse_variant("rec-ours-full")]
    with pytest.raises(KeyboardInterrupt):
        A.run_ablation(BASE, corpus, tmp_path, variant, tgt_len=8, steps=6, attn_grid=[8], batch_size=4)
    assert not (tmp_path / "rec-ours-full" / "result.json").exists()
    assert list((tmp_path / "rec-ours-full" / "run" / "checkpoints").glob("step_*"))
    monkeypatch.setattr(Trainer, "train_step", train_step)
    rows = A.run_ablation(BASE, corpus, tmp_path, variant, tgt_len=8, steps=6, attn_grid=[8], batch_size=4)
    assert rows[0]["train_steps"] == 6
    with pytest.raises(ConfigError, match="steps"):
        A.run_ablation(BASE, corpus, tmp_path / "x", variant, tgt_len=8, steps=0, attn_grid=[8])
