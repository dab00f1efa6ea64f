"""txl experiment long-context: the tables, JSON and figures of a tiny grid, resumed without training again."""

from __future__ import annotations

import json

import pytest

from transformer_xl.cli import main


@pytest.mark.slow
def test_cli_long_context_writes_tables_json_and_figures(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "lc"
    argv = ["experiment", "long-context", "--out", str(out), "--distances", "6,20", "--span-lens", "4",
            "--alphabet", "abcd", "--tokens", "3000,600,600", "--tgt-len", "8", "--mem-len", "16", "--steps", "3",
            "--warmup", "1", "--seeds", "0,1", "--encoding-seeds", "0", "--depth-seeds", "0", "--depths", "1",
            "--depth-mems", "8", "--eval-mems", "0,32", "--parts", "recurrence,curve,encodings,depth,recl",
            "--recl-grid", "2:6:2", "--curve-distances", "8", "--recl-resamples", "5"]
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
    recl = doc["recl"]["summary"]  # each seed's group: the recurrence and encodings models (seed 0 only)
    assert sorted(recl) == ["alrfou-L2-m16", "ours-L2-m0", "ours-L2-m16", "shaw-L2-m16", "vaswani-L2-m16"]
    assert set(recl["ours-L2-m16"]["0.1"]["seeds"]) == {"0"} and recl["ours-L2-m16"]["0.1"]["mean"] in (2, 4, 6)
    assert "RECL on this corpus" in md
    assert sorted((r["corpus_distance"], r["seed"], r["variant"]) for r in doc["curve_rows"]) == [
        (8, 0, "ours-L2-m0"), (8, 0, "ours-L2-m16"), (8, 1, "ours-L2-m0"), (8, 1, "ours-L2-m16")]
    assert "Reach over distance" in md and "| 8 | 0 |" in md  # the curve's models in the per-model table
    for fig in ("recurrence", "distance", "depth", "memory", "recl"):
        assert (out / f"long-context-{fig}.png").stat().st_size > 0
    capsys.readouterr()
    assert main(argv) == 0  # finished models are read back, not trained again
    assert "training" not in capsys.readouterr().err


def test_cli_long_context_refuses_an_unknown_part_or_a_recl_without_a_group(tmp_path, capsys) -> None:
    base = ["experiment", "long-context", "--out", str(tmp_path / "lc"), "--tokens", "3000,600,600", "--steps", "2"]
    assert main([*base, "--parts", "recurrence,width"]) != 0
    assert "unknown width" in capsys.readouterr().err
    assert main([*base, "--parts", "depth,recl", "--depths", "1", "--depth-mems", "8"]) != 0
    assert "train the recurrence or encodings part" in capsys.readouterr().err
    assert main([*base, "--seeds", "1,1"]) != 0
    assert "distinct seeds" in capsys.readouterr().err
