"""txl.experiments.speed / ablations / tables and `txl experiment ...` at toy sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from txl import TXLConfig
from txl._cli import main
from txl.errors import ConfigError
from txl.experiments import ablations as A
from txl.experiments.speed import eval_speed
from txl.experiments.tables import markdown_table

BASE = TXLConfig(n_token=40, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=8, mem_len=8)


def test_eval_speed_rows() -> None:
    data = np.random.default_rng(0).integers(0, 40, 4000)
    rows = eval_speed(BASE, data, [8, 16], tgt_len=4, xl_batch=2, rows=4, xl_tokens=32, vanilla_tokens=8, repeats=2)
    assert [r["attn_len"] for r in rows] == [8, 16]
    for r in rows:
        assert r["xl_ms_per_token"] > 0 and r["vanilla_ms_per_token"] > 0
        assert r["slowdown"] == pytest.approx(r["vanilla_ms_per_token"] / r["xl_ms_per_token"])
        assert r["xl_tokens"] == 32 and r["vanilla_tokens"] == 8 and len(r["xl_ms_all"]) == 2
    with pytest.raises(ConfigError):
        eval_speed(BASE, data, [8], vanilla_attn_type=0)


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


def test_half_loss_trains_only_on_the_second_half() -> None:
    """With the half loss, the targets of the first half of a segment get no gradient at all."""
    cfg = A.variant_config(BASE, A.parse_variant("norec-ours-half"), 8)
    data = np.random.default_rng(0).integers(0, 40, 400)
    seen = []

    def spy(nll):
        nll.register_hook(lambda g: seen.append(g.clone()))
        return nll

    from txl.model import TransformerXLLM

    forward = TransformerXLLM.forward

    def patched(self, *a, **k):
        out = forward(self, *a, **k)
        out.nll = spy(out.nll)
        return out

    TransformerXLLM.forward = patched
    try:
        A.train_lm(cfg, data, steps=2, batch_size=4, half_loss=True, warmup=1)
    finally:
        TransformerXLLM.forward = forward
    g = seen[0]  # [B, T]
    assert torch.all(g[:, :4] == 0) and torch.all(g[:, 4:] != 0)


def test_run_ablation_is_resumable_and_tabulates(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    train, valid = rng.integers(0, 40, 3000), rng.integers(0, 40, 600)
    variants = [A.parse_variant("rec-ours-full"), A.parse_variant("norec-alrfou-half")]
    rows = A.run_ablation(BASE, train, valid, tmp_path, variants, tgt_len=8, steps=3, attn_grid=[8, 16, 32],
                          batch_size=4)
    assert [r["variant"] for r in rows] == ["rec-ours-full", "norec-alrfou-half"]
    xl, van = rows
    assert xl["attn_len_init"] == 16 and van["attn_len_init"] == 8
    assert [t["attn_len"] for t in xl["tried"]] == [16, 32]  # init (8 + 8), then mem 24
    assert [t["attn_len"] for t in van["tried"]] == [8]  # attn_type 3 learned only 8 positions
    assert (tmp_path / "rec-ours-full" / "model.safetensors").is_file()
    monkeypatch.setattr(A, "train_lm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    again = A.run_ablation(BASE, train, valid, tmp_path, variants, tgt_len=8, steps=3, attn_grid=[8, 16, 32])
    assert [r["ppl_best"] for r in again] == [r["ppl_best"] for r in rows]
    table = A.ablation_table(rows)
    assert "Al-Rfou et al. (2018)" in table and "✓" in table and "PPL best" in table
    assert "bpc best" in A.ablation_table(rows, char_level=True)


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, None]]) == "| a | b |\n|---|---|\n| 1 |  |\n"


def test_cli_experiments(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(rng.choice([f"w{i}" for i in range(20)], 10)) for _ in range(400)) + "\n")
    out = tmp_path / "abl"
    argv = ["experiment", "ablation", "--dataset", str(path), "--variants", "rec-ours-full", "--tgt-len", "8",
            "--steps", "2", "--batch-size", "4", "--out", str(out)]
    assert main(argv) == 0
    assert "Ours" in (out / "ablations.md").read_text()
    json.loads((out / "rec-ours-full" / "result.json").read_text())
    pytest.importorskip("matplotlib")
    for command in (["experiment", "eval-speed"], ["bench", "eval-speed"]):  # the same command, two names
        speed = tmp_path / "-".join(command)
        assert main([*command, "--dataset", str(path), "--model-preset", "tiny", "--attn-lens", "8",
                     "--tgt-len", "4", "--xl-batch", "2", "--xl-tokens", "16", "--rows", "4", "--repeats", "1",
                     "--out", str(speed)]) == 0
        assert json.loads((speed / "eval-speed.json").read_text())[0]["attn_len"] == 8
    capsys.readouterr()
    assert main(["experiment", "ablation", "--dataset", str(path), "--variants", "rec-nope-full", "--out",
                 str(out)]) == 2
    assert "bad variant" in capsys.readouterr().err
