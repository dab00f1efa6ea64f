"""The ablations of paper Tables 6 and 10 at toy sizes: variants, training through the Trainer, the attention-length
search, the window column, seeds, and the equal-memory lengths."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tests.helpers import tiny_config
from transformer_xl.data import Corpus, Vocab
from transformer_xl.errors import ConfigError
from transformer_xl.experiments import ablation_report as R
from transformer_xl.experiments import ablations as A

BASE = tiny_config(n_token=40, tgt_len=8, mem_len=8, init_std=0.02)
SEARCH = A.AttnSearch(step=2, max_len=32)


def _corpus(valid: int = 600) -> Corpus:
    rng = np.random.default_rng(0)
    return Corpus.from_arrays("toy", {"train": rng.integers(0, 40, 3000), "valid": rng.integers(0, 40, valid)},
                              n_token=40)


def test_variants_and_configs() -> None:
    assert len(A.TABLE6) == 9 and len({v.name for v in A.TABLE6}) == 9
    v = A.parse_variant("norec-alrfou-half")
    cfg = A.variant_config(BASE, v, 16)
    assert (cfg.attn_type, cfg.tgt_len, cfg.mem_len) == (3, 16, 0)
    rec = A.variant_config(BASE, A.parse_variant("rec-shaw-full"), 16)
    assert (rec.attn_type, rec.tgt_len, rec.mem_len) == (1, 16, 16)
    long = A.variant_config(BASE, A.parse_variant("norec-ours-full-x1.375"), 128)
    assert (long.tgt_len, long.mem_len) == (176, 0)
    for variants in A.VARIANT_SETS.values():
        assert all(A.parse_variant(v.name) == v for v in variants)  # every name reads back
    assert [v.name for v in A.TABLE10_RATIO[2:4]] == ["norec-ours-full-x1.375", "norec-ours-half-x1.34375"]
    assert [v.name for v in A.TABLE10[2:]] == ["norec-ours-full-eqmem", "norec-ours-half-eqmem",
                                               "norec-ours-full-eqmem-eqtok", "norec-ours-half-eqmem-eqtok"]
    eq = A.parse_variant("norec-ours-full-eqmem-eqtok")
    assert eq.equal_memory and eq.equal_tokens and A.variant_config(BASE, eq, 32, train_len=44).tgt_len == 44
    with pytest.raises(ConfigError, match="measured first"):
        A.variant_config(BASE, eq, 32)
    assert A.variant_steps(eq, 3000, 32, 44) == 2182 and A.variant_steps(A.TABLE6[0], 3000, 32, 32) == 3000
    for bad in ("rec-ours", "x-ours-full", "rec-bogus-full", "rec-ours-quarter", "rec-ours-full-eqmem",
                "norec-ours-full-eqtok-eqmem", "norec-ours-full-x0", "norec-ours-full-xnan"):
        with pytest.raises(ConfigError):
            A.parse_variant(bad)


def test_the_three_wikitext_rows_are_not_called_table7() -> None:
    """The paper's Table 7 is on One Billion Word: the name is refused with a pointer to what it used to select."""
    assert [v.name for v in A.variant_set("table6-core")] == ["rec-ours-full", "rec-shaw-full", "norec-ours-full"]
    assert set(A.TABLE6_CORE) <= set(A.TABLE6)
    with pytest.raises(ConfigError, match=r"One Billion Word.*table6-core"):
        A.variant_set("table7")
    assert not hasattr(A, "TABLE7")
    assert [v.name for v in A.variant_set("rec-ours-full, norec-ours-half")] == ["rec-ours-full", "norec-ours-half"]


def test_variants_train_through_the_trainer_with_the_half_loss(tmp_path) -> None:
    """A Half variant is a ``txl train`` run with ``half_loss``; an interrupted variant resumes from its run."""
    corpus = Corpus.from_arrays("toy", {"train": np.random.default_rng(0).integers(0, 40, 3000),
                                        "valid": np.random.default_rng(1).integers(0, 40, 300)}, n_token=40)
    cfg = A.variant_config(BASE, A.parse_variant("norec-ours-half"), 8)
    model, log = A.train_variant(cfg, corpus, tmp_path / "run", steps=4, batch_size=4, half_loss=True, warmup=1)
    run = json.loads((tmp_path / "run" / "config.json").read_text())
    assert run["train"]["half_loss"] is True and run["model"]["mem_len"] == 0 and run["model"]["attn_type"] == 0
    assert run["train"]["device"] == "cpu"
    assert log["steps"] == 4 and log["tokens"] == 4 * 4 * 8 and [h["step"] for h in log["history"]] == [4]
    assert not model.training
    # a longer run of the same variant continues from the checkpoint instead of starting over
    _, longer = A.train_variant(cfg, corpus, tmp_path / "run", steps=6, batch_size=4, half_loss=True, warmup=1)
    assert longer["steps"] == 6 and longer["tokens"] == 6 * 4 * 8


# ---------------------------------------------------------------------------------------------- the search
# ---------------------------------------------------------------------------------------------- the experiment
def test_run_ablation_evaluates_as_the_paper_and_is_resumable(tmp_path, monkeypatch) -> None:
    """The search evaluates with same_length (mem_len = attention length); no-recurrence rows get the stride-1
    window at their training length; attn_type 3 is not searched beyond its learned positions."""
    corpus = _corpus()
    calls = []
    evaluate = A.evaluate

    def spy(model, data, **kw):
        calls.append(kw)
        return evaluate(model, data, **kw)

    monkeypatch.setattr(A, "evaluate", spy)
    variants = [A.parse_variant("rec-ours-full"), A.parse_variant("norec-alrfou-half"),
                A.parse_variant("norec-ours-full")]
    rows = A.run_ablation(BASE, corpus, tmp_path, variants, tgt_len=8, steps=3, search=SEARCH, batch_size=4)
    assert [r["variant"] for r in rows] == ["rec-ours-full", "norec-alrfou-half", "norec-ours-full"]
    xl, van, norec = rows
    assert xl["attn_len_init"] == 16 and van["attn_len_init"] == 8
    for r in (xl, norec):
        init, *search = r["tried"]
        assert not init["same_length"] and search and all(t["same_length"] for t in search)
        assert all(t["mem_len"] == t["attn_len"] and t["tgt_len"] == 8 for t in search)
        assert search[0]["attn_len"] == 8 and r["attn_search"]["same_length"] is True
        assert r["loss_best"] == min(t["loss"] for t in r["tried"])
        assert r["attn_len_best"] == min(t["attn_len"] for t in r["tried"]
                                         if t["loss"] <= r["loss_best"] * (1 + SEARCH.rel_tol))
    searched = [c for c in calls if c.get("same_length")]
    assert len(searched) == len(xl["tried"]) + len(norec["tried"]) - 2
    assert all(c["mem_len"] >= 1 and c["ext_len"] == 0 for c in searched)
    assert [t["attn_len"] for t in van["tried"]] == [8] and van["best_from"] == "init"  # 8 learned positions only
    assert xl["ppl_window"] is None and xl["window_len"] is None
    for r in (van, norec):  # every token from its own window of the training length
        assert r["window_len"] == 8 and r["window_tokens"] == 599 and math.isclose(r["ppl_window"],
                                                                                   math.exp(r["loss_window"]))
    assert xl["train_tokens"] == 3 * 4 * 8 and xl["seed"] == 0 and xl["device"] == "cpu"
    assert (tmp_path / "seed0" / "rec-ours-full" / "model.safetensors").is_file()
    vocab = Vocab.load(tmp_path / "seed0" / "rec-ours-full" / "vocab.json")
    assert vocab.sha256() == corpus.vocab.sha256()  # self-contained
    monkeypatch.setattr(A, "train_variant", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    again = A.run_ablation(BASE, corpus, tmp_path, variants, tgt_len=8, steps=3, search=SEARCH)
    assert [r["ppl_best"] for r in again] == [r["ppl_best"] for r in rows]
    text, doc = R.report(rows)
    assert "Al-Rfou et al. (2018)" in text and "✓" in text and "PPL window" in text and "PPL best" in text
    assert "bpc window" in R.report(rows, char_level=True)[0]
    assert [a["variant"] for a in doc["aggregate"]] == [r["variant"] for r in rows]
    json.dumps(doc)


def test_seeds_train_apart_and_aggregate(tmp_path) -> None:
    rows = A.run_ablation(BASE, _corpus(300), tmp_path, [A.parse_variant("norec-ours-full")], tgt_len=8, steps=2,
                          search=A.AttnSearch(step=4, max_len=16), seeds=(0, 1), batch_size=4)
    assert [r["seed"] for r in rows] == [0, 1] and rows[0]["loss_init"] != rows[1]["loss_init"]
    assert all((tmp_path / f"seed{s}" / "norec-ours-full" / "result.json").is_file() for s in (0, 1))
    (agg,) = R.aggregate(rows)
    assert agg["seeds"] == [0, 1]
    for key in ("ppl_init", "ppl_best", "ppl_window", "attn_len_best", "loss_best"):
        values = [r[key] for r in rows]
        assert math.isclose(agg[key]["mean"], (values[0] + values[1]) / 2)
        assert math.isclose(agg[key]["std"], abs(values[0] - values[1]) / math.sqrt(2), abs_tol=1e-12)
    with pytest.raises(ConfigError, match="seed"):
        A.run_ablation(BASE, _corpus(300), tmp_path, [A.TABLE6[0]], tgt_len=8, steps=2, search=SEARCH, seeds=())


def test_a_signal_leaves_the_variant_unfinished_and_resumable(tmp_path, monkeypatch) -> None:
    """SIGTERM/Ctrl-C during a variant's training: no result is written (a re-run does not skip it), the
    interrupt reaches the caller, and the variant's run directory holds the checkpoint to resume from."""
    corpus = Corpus.from_arrays("toy", {"train": np.random.default_rng(0).integers(0, 40, 3000),
                                        "valid": np.random.default_rng(1).integers(0, 40, 300)}, n_token=40)
    from tests.helpers import signal_at_step
    from transformer_xl.train import Trainer

    train_step = signal_at_step(monkeypatch, 2)
    variant = [A.parse_variant("rec-ours-full")]
    search = A.AttnSearch(step=8, max_len=8)
    with pytest.raises(KeyboardInterrupt):
        A.run_ablation(BASE, corpus, tmp_path, variant, tgt_len=8, steps=6, search=search, batch_size=4)
    assert not (tmp_path / "seed0" / "rec-ours-full" / "result.json").exists()
    assert list((tmp_path / "seed0" / "rec-ours-full" / "run" / "checkpoints").glob("step_*"))
    monkeypatch.setattr(Trainer, "train_step", train_step)
    rows = A.run_ablation(BASE, corpus, tmp_path, variant, tgt_len=8, steps=6, search=search, batch_size=4)
    assert rows[0]["train_steps"] == 6
    with pytest.raises(ConfigError, match="steps"):
        A.run_ablation(BASE, corpus, tmp_path / "x", variant, tgt_len=8, steps=0, search=search)


@pytest.mark.slow
def test_equal_memory_lengths_fit_the_transformer_xl_peak(tmp_path) -> None:
    variants = [A.parse_variant(n) for n in ("norec-ours-full-eqmem", "norec-ours-full-eqmem-eqtok")]
    doc = A.equal_memory_lengths(BASE, variants, tgt_len=8, batch_size=4)
    (entry,) = doc["lengths"].values()
    tried = dict(entry["tried"])
    L = entry["length"]
    assert L > 8 and entry["target_variant"] == "rec-ours-full" and tried[L] <= entry["target_bytes"] < tried[L + 1]
    rows = A.run_ablation(BASE, _corpus(300), tmp_path, variants, tgt_len=8, steps=4, search=SEARCH, batch_size=4)
    assert [r["train_tgt_len"] for r in rows] == [L, L]
    assert [r["train_steps"] for r in rows] == [4, round(4 * 8 / L)]  # equal steps, then equal tokens
    assert rows[0]["equal_memory"]["target_bytes"] == entry["target_bytes"]
    saved = json.loads((tmp_path / "equal-memory.json").read_text())
    assert saved["lengths"] == json.loads(json.dumps(doc["lengths"])) and A.read_equal_memory(tmp_path) == saved
    assert "Equal peak training memory" in R.report(rows, equal_memory=saved)[0]
    with pytest.raises(ConfigError, match="another model"):  # a run measured for another size is not reused
        A.run_ablation(BASE.replace(d_inner=48), _corpus(300), tmp_path, variants, tgt_len=8, steps=4,
                       search=SEARCH, batch_size=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_ablation_trains_measures_and_evaluates_on_cuda(tmp_path) -> None:
    rows = A.run_ablation(BASE, _corpus(300), tmp_path, [A.parse_variant("norec-ours-full-eqmem")], tgt_len=8,
                          steps=2, search=A.AttnSearch(step=4, max_len=16), batch_size=4, device="cuda")
    assert rows[0]["device"] == "cuda" and rows[0]["ppl_window"] is not None
    run = json.loads((tmp_path / "seed0" / "norec-ours-full-eqmem" / "run" / "config.json").read_text())
    assert run["train"]["device"] == "cuda"
    assert json.loads((tmp_path / "equal-memory.json").read_text())["method"] == "allocator"


def test_a_variant_run_stopped_before_its_first_checkpoint_is_cleared_but_never_a_users_file(tmp_path) -> None:
    """A variant's directory without a checkpoint is started over: what a run writes is removed; a directory that
    also holds a file of the user's is refused in one line and kept whole (it was removed whole before)."""
    run = tmp_path / "seed0" / "variant"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl", ".lock", ".config.json.9x_k2q0a.tmp", ".metrics.jsonl.old"):
        (run / name).write_text("{}")
    (run / ".best.ab12cd34.tmp").mkdir()  # atomic_dir's temporary folder
    A.clear_unstarted_run(run)
    assert not run.exists()
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes\.txt.*did not write|did not write.*notes\.txt"):
        A.clear_unstarted_run(run)
    assert (run / "notes.txt").read_text() == "mine" and (run / "metrics.jsonl").exists()


@pytest.mark.parametrize("hidden", [".git", ".env", ".notes.old", ".mine.ab12cd34.tmp", ".config.json.tmp",
                                    ".lock.old"])
def test_a_hidden_name_of_the_users_keeps_an_unstarted_run_whole(tmp_path, hidden) -> None:
    """Hidden names are the user's too (a ``.git``, an ``.env``): only the run lock and txl's temporaries of a
    run's own entries are cleared with the run; anything else is refused in one line and nothing is removed."""
    run = tmp_path / "variant"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / ".lock").write_text("")
    if hidden == ".git":
        (run / hidden).mkdir()
        (run / hidden / "HEAD").write_text("ref: refs/heads/main\n")
    else:
        (run / hidden).write_text("SECRET=1\n")
    with pytest.raises(ConfigError, match=rf"^{run} holds files a training run did not write \({hidden}\): move "
                                          r"them, or give the experiment another --out$"):
        A.clear_unstarted_run(run)
    assert sorted(p.name for p in run.iterdir()) == sorted([hidden, ".lock", "checkpoints", "config.json"])


def test_an_unstarted_run_path_that_is_a_file_is_one_line(tmp_path) -> None:
    """A file where the variant's run directory goes is refused in one line (it was a NotADirectoryError
    traceback), and kept."""
    run = tmp_path / "variant"
    run.write_text("mine")
    with pytest.raises(ConfigError, match=rf"^{run} is not a directory: give the experiment another --out$"):
        A.clear_unstarted_run(run)
    assert run.read_text() == "mine"
