"""txl experiment long-context: the tables, JSON and figures of a tiny grid, resumed without training again."""

from __future__ import annotations

import json

import pytest

from transformer_xl.cli import main


def test_cli_long_context_writes_tables_json_and_figures(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "lc"
    argv = ["experiment", "long-context", "--out", str(out), "--distances", "6,20", "--span-lens", "4",
            "--alphabet", "abcd", "--tokens", "3000,600,600", "--tgt-len", "8", "--mem-len", "16", "--steps", "3",
            "--warmup", "1", "--seeds", "0,1", "--encoding-seeds", "0", "--depths", "1", "--depth-mems", "8",
            "--eval-mems", "0,32", "--parts", "recurrence,encodings,depth"]
    assert main(argv) == 0
    doc = json.loads((out / "long-context.json").read_text())
    names = sorted({(r["variant"], r["seed"]) for r in doc["rows"]})
    assert names == sorted([("ours-L2-m16", 0), ("ours-L2-m0", 0), ("ours-L2-m16", 1), ("ours-L2-m0", 1),
                            ("shaw-L2-m16", 0), ("vaswani-L2-m16", 0), ("alrfou-L2-m16", 0), ("ours-L1-m8", 0)])
    alrfou = next(r for r in doc["rows"] if r["variant"] == "alrfou-L2-m16")
    assert sorted(e["mem_len"] for e in alrfou["evals"]) == [0, 16]  # no learned position for 32
    vanilla = next(r for r in doc["rows"] if r["variant"] == "ours-L2-m0")
    assert [e["kind"] for e in vanilla["evals"]] == ["train", "memory", "window"]
    md = (out / "long-context.md").read_text()
    for heading in ("Recurrence against none", "depth and memory", "longer than training", "shorter than training"):
        assert heading in md
    assert "D = 6" in md and "D = 20" in md and "± " in md  # two seeds: a spread
    for fig in ("recurrence", "depth", "memory"):
        assert (out / f"long-context-{fig}.png").stat().st_size > 0
    capsys.readouterr()
    assert main(argv) == 0  # finished models are read back, not trained again
    assert "training" not in capsys.readouterr().err
