"""Fine-tuning (``txl train --init-from``): the official loop's losses from an officially initialized model, the
architecture and vocabulary taken from the model, one-line refusals, and a resumed fine-tuning run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.equivalence.official_oracle import OfficialOracle, official_train_losses
from tests.helpers import SHARED_DATA, corpus_dir, needs_shared_data, one_line_error, tiny_model, tiny_train_config
from transformer_xl.data import Vocab, load_corpus
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.store.files import sha256_file
from transformer_xl.train import Trainer, train
from transformer_xl.train.config import MODEL_KEYS, TrainConfig
from transformer_xl.train.init_from import SETTABLE, open_init
from transformer_xl.train.metrics import read_metrics

#: The architecture of tests/helpers.tiny_train_config, as official MemTransformerLM kwargs.
ARCH = dict(n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0, tgt_len=6, ext_len=0,
            mem_len=6)
REL_TOL = 1e-6  # the largest relative difference of a step's loss from the official loop's


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))


def official_model_dir(root: Path, vocab: Vocab, seed: int = 0, **arch: Any) -> tuple[dict[str, Any], dict, Path]:
    """An officially initialized model (``weights_init``) converted with ``from_official`` and saved with ``vocab``
    as a txl model directory; returns the official kwargs, the official state dict and the directory."""
    from transformer_xl.interop.official import from_official

    kwargs = {"n_token": len(vocab), **ARCH, **arch}
    state = OfficialOracle(kwargs, None, dtype=torch.float32).official_init_state_dict(seed=seed)
    directory = from_official(kwargs, state).save_pretrained(Path(root) / "pretrained")
    vocab.save(directory / "vocab.json")
    return kwargs, state, directory


def finetune_losses(root: Path, dataset: str, data_dir: str | None, steps: int, batch_size: int,
                    **arch: Any) -> tuple[list[float], list[float]]:
    """(txl's per-step losses, the official loop's) of ``steps`` Adam + cosine steps from one official model."""
    vocab = load_corpus(dataset, data_dir).vocab
    kwargs, state, model_dir = official_model_dir(root, vocab, **arch)
    cfg = tiny_train_config(root / "run", dataset, data_dir=data_dir, init_from=str(model_dir), batch_size=batch_size,
                            max_step=steps, eval_interval=steps, save_interval=steps, warmup_step=0, lr=3e-3,
                            clip=0.25, optim="adam", scheduler="cosine", **arch)
    trainer = Trainer(cfg)
    train_ids = torch.as_tensor(trainer.corpus.splits["train"].astype("int64"))
    trainer.fit()
    ours = [r["train_loss"] for r in read_metrics(root / "run" / "metrics.jsonl") if r["kind"] == "train"]
    official = official_train_losses(OfficialOracle(kwargs, state), train_ids, batch_size=batch_size,
                                     max_step=steps, lr=3e-3, clip=0.25)
    return ours, official


def run_config(out: Path, dataset: str, **kw: Any) -> TrainConfig:
    """:func:`tiny_train_config` where any model field may be given."""
    model = {k: kw.pop(k) for k in list(kw) if k in MODEL_KEYS}
    cfg = tiny_train_config(out, dataset, **kw)
    return dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, **model})


def _max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_finetuning_matches_the_official_training_loop(tmp_path: Path) -> None:
    """24 steps on a small word corpus (past an epoch's end: a short last segment, memories restarted)."""
    ours, official = finetune_losses(tmp_path, str(corpus_dir(tmp_path)), None, steps=24, batch_size=4)
    print(f"\nfine-tuning vs official loop, 24 steps: max relative loss difference {_max_rel(ours, official):.2e}")
    assert _max_rel(ours, official) <= REL_TOL, (ours, official)
    assert official[-1] < official[0] - 0.1  # it learns: the comparison is not of a flat line


@pytest.mark.slow
@needs_shared_data
def test_finetuning_on_ptb_matches_the_official_training_loop(tmp_path: Path) -> None:
    """30 steps on the real Penn Treebank (10,000 words) with segments of 16 and a memory of 16."""
    ours, official = finetune_losses(tmp_path, "ptb", str(SHARED_DATA), steps=30, batch_size=8, tgt_len=16,
                                     mem_len=16)
    print(f"\nPTB fine-tuning vs official loop, 30 steps: max relative loss difference {_max_rel(ours, official):.2e}")
    assert _max_rel(ours, official) <= REL_TOL, (ours, official)


# ------------------------------------------------------------------------------------------------ helpers
def _pretrained(root: Path, data: Path, **overrides: Any) -> tuple[Any, Path]:
    """A tiny model (the helpers' run architecture) for ``data``'s vocabulary, saved with it as ``root/m``."""
    vocab = load_corpus(str(data)).vocab
    model = tiny_model(3, n_token=len(vocab), tgt_len=6, mem_len=6, **overrides)
    model.save_pretrained(root / "m")
    vocab.save(root / "m" / "vocab.json")
    return model, root / "m"


def test_run_records_init_from_and_starts_from_its_weights(tmp_path: Path) -> None:
    data = corpus_dir(tmp_path)
    model, m = _pretrained(tmp_path, data)
    trainer = Trainer(run_config(tmp_path / "run", str(data), init_from=str(m), dropout=0.2, dropatt=0.1))
    assert trainer.step == 0 and trainer.model_cfg.dropout == 0.2 and trainer.model_cfg.dropatt == 0.1
    for name, p in model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], p), name
    trainer.fit()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["init_from"] == str(m) and saved["model"]["dropout"] == 0.2
    assert saved["init_from"]["sha256"] == sha256_file(m / "model.safetensors")
    assert saved["init_from"]["path"] == str(m.resolve()) and saved["dataset"]["vocab_sha256"] == \
        Vocab.load(m / "vocab.json").sha256()


@pytest.mark.parametrize("flag", ["n_layer", "d_model", "n_head", "d_inner", "cutoffs", "pre_lnorm", "attn_type",
                                  "tie_weight"])
def test_a_shape_flag_conflicting_with_the_model_is_refused(tmp_path: Path, flag: str) -> None:
    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data)
    value = {"n_layer": 3, "d_model": 32, "n_head": 4, "d_inner": 64, "cutoffs": [10], "pre_lnorm": True,
             "attn_type": 2, "tie_weight": False}[flag]
    with pytest.raises(ConfigError) as info:
        Trainer(run_config(tmp_path / "run", str(data), init_from=str(m), **{flag: value}))
    own = {"n_layer": 2, "d_model": 16, "n_head": 2, "d_inner": 32, "cutoffs": "[]", "pre_lnorm": "false",
           "attn_type": 0, "tie_weight": "true"}[flag]
    assert f"({flag}={own})" in str(info.value) and f"--{flag.replace('_', '-')}" in str(info.value)
    assert not (tmp_path / "run" / "config.json").exists()


def test_cli_refuses_a_conflicting_flag_and_accepts_dropout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformer_xl.cli import main

    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data)
    common = ["train", "--dataset", str(data), "--init-from", str(m), "--batch-size", "4", "--max-step", "2",
              "--eval-interval", "2", "--no-final-eval", "--no-progress", "--eval-max-tokens", "50"]
    assert main([*common, "--n-layer", "4", "--out-dir", str(tmp_path / "a")]) == 2
    err = one_line_error(capsys, "txl train: error: ")
    assert "--n-layer 4 conflicts with the model of --init-from" in err and "(n_layer=2)" in err
    # a training preset's architecture gives way to the model's; dropout and lengths may be set
    assert main([*common, "--preset", "wt2-cpu", "--dropout", "0.3", "--tgt-len", "5", "--mem-len", "7",
                 "--out-dir", str(tmp_path / "b")]) == 0
    saved = json.loads((tmp_path / "b" / "config.json").read_text())["model"]
    assert (saved["dropout"], saved["tgt_len"], saved["mem_len"], saved["d_model"], saved["pre_lnorm"]) == \
        (0.3, 5, 7, 16, False)


def test_unknown_words_are_counted_and_mapped_to_unk(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = corpus_dir(tmp_path)
    corpus = load_corpus(str(data))
    dropped = {"cat", "dog"}
    words = Vocab([s for s in corpus.vocab.idx2sym if s not in dropped], special=["<eos>", "<unk>"], eos="<eos>",
                  unk="<unk>")
    model = tiny_model(0, n_token=len(words), tgt_len=6, mem_len=6)
    model.save_pretrained(tmp_path / "m")
    words.save(tmp_path / "m" / "vocab.json")
    text = (data / "train.txt").read_text().split()
    expected = sum(w in dropped for w in text)
    total = len(text) + (data / "train.txt").read_text().count("\n")
    assert expected > 0
    trainer = Trainer(run_config(tmp_path / "run", str(data), init_from=str(tmp_path / "m")))
    err = capsys.readouterr().err
    assert (f"txl train: {expected:,} of {total:,} training tokens ({100 * expected / total:.2f} %) are not in the "
            "model's vocabulary and map to <unk>") in err
    ids = trainer.corpus.splits["train"]
    assert int((ids == words.unk_idx).sum()) == expected and len(trainer.corpus.vocab) == len(words)
    trainer.close()


def test_a_dataset_of_another_level_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformer_xl.cli import main

    _, m = _pretrained(tmp_path, corpus_dir(tmp_path))
    assert main(["train", "--dataset", "ptb-char", "--init-from", str(m), "--out-dir", str(tmp_path / "r"),
                 "--batch-size", "4"]) == 2
    err = one_line_error(capsys, "txl train: error: ")
    assert "'ptb-char' is char-level text but the vocabulary is word-level" in err


def test_missing_vocabulary_needs_init_vocab(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data)
    (m / "vocab.json").rename(tmp_path / "words.json")
    with pytest.raises(ConfigError, match="pass --init-vocab PATH"):
        open_init(m)
    trainer = Trainer(run_config(tmp_path / "run", str(data), init_from=str(m),
                                        init_vocab=str(tmp_path / "words.json")))
    assert len(trainer.corpus.vocab) == trainer.model_cfg.n_token
    trainer.close()
    with pytest.raises(DataError, match="has 3 symbols but the model of --init-from"):
        Vocab(["<eos>", "<unk>", "a"], unk="<unk>").save(tmp_path / "small.json")
        open_init(m, tmp_path / "small.json")
    with pytest.raises(ConfigError, match="give init_from"):
        run_config(tmp_path / "x", str(data), init_vocab="v.json")


def test_attn_type_1_keeps_its_position_table_length(tmp_path: Path) -> None:
    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data, attn_type=1)
    with pytest.raises(ConfigError, match="tgt_len \\+ ext_len \\+ mem_len = 12 rows"):
        Trainer(run_config(tmp_path / "run", str(data), init_from=str(m), attn_type=1, tgt_len=8))
    trainer = Trainer(run_config(tmp_path / "run", str(data), init_from=str(m), attn_type=1, tgt_len=8,
                                        mem_len=4))
    assert trainer.model_cfg.max_klen == 12
    trainer.close()


def test_init_from_with_resume_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformer_xl.cli import main

    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data)
    train(run_config(tmp_path / "run", str(data), init_from=str(m), max_step=2))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run"), "--init-from", str(m)]) == 2
    assert "--init-from cannot be combined with --resume" in one_line_error(capsys, "txl train: error: ")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ConfigError, match="cannot change init_from on --resume"):
        Trainer(run_config(tmp_path / "run", str(data), init_from=str(other), max_step=4),
                resume=tmp_path / "run")


def test_a_resumed_finetuning_run_continues_from_its_checkpoint(tmp_path: Path) -> None:
    """Stopped at step 4 and resumed, a fine-tuning run gives the losses of an uninterrupted one, bit for bit,
    although the pretrained model is gone by then (it is read only when the run starts)."""
    data = corpus_dir(tmp_path)
    _, m = _pretrained(tmp_path, data)
    kw = dict(init_from=str(m), scheduler="constant", warmup_step=0, dropout=0.1)
    train(run_config(tmp_path / "whole", str(data), max_step=8, **kw))
    train(run_config(tmp_path / "parts", str(data), max_step=4, **kw))
    m.rename(tmp_path / "gone")
    summary = train(run_config(tmp_path / "parts", str(data), max_step=8, **kw), resume=tmp_path / "parts")
    assert summary["step"] == 8

    def losses(run: str) -> list[float]:
        return [r["train_loss"] for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["kind"] == "train"]

    assert losses("parts") == losses("whole") and len(losses("whole")) == 8
    saved = json.loads((tmp_path / "parts" / "config.json").read_text())
    assert saved["init_from"]["path"] == str(m.resolve())  # the record survives the resume


def test_settable_fields_are_model_fields() -> None:
    from transformer_xl.train.config import MODEL_KEYS

    assert set(SETTABLE) <= set(MODEL_KEYS)


def test_every_kind_of_model_directory_can_be_fine_tuned(tmp_path: Path) -> None:
    """A run's best/, a checkpoint, a run directory, save_pretrained and a `txl convert --from hf` output; a
    damaged one is refused (its manifest is verified as transformer_xl.inference.loading.load_model does)."""
    from tests.helpers import damage_file, model_dirs
    from transformer_xl.errors import CheckpointError

    data = corpus_dir(tmp_path)
    vocab = load_corpus(str(data)).vocab
    model = tiny_model(3, n_token=len(vocab), tgt_len=6, mem_len=6)
    dirs = model_dirs(tmp_path / "kinds", model, vocab)
    dirs["run"] = dirs["best"].parent
    for kind, d in dirs.items():
        init = open_init(d)
        assert init.vocab.sha256() == vocab.sha256(), kind
        for name, p in model.state_dict().items():
            assert torch.equal(init.model.state_dict()[name], p), (kind, name)
    damage_file(dirs["pretrained"] / "model.safetensors", "bit-flip")
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        open_init(dirs["pretrained"])


def test_open_init_takes_a_hub_id(tmp_path, hub_cache) -> None:
    """`--init-from ORG/NAME`: the model and its vocabulary from the Hub cache."""
    from tests.helpers import txl_repo

    _, commit = txl_repo(tmp_path, hub_cache)
    init = open_init("org/tiny")
    assert init.model_dir == hub_cache / "models--org--tiny" / "snapshots" / commit
    assert init.vocab_path.name == "vocab.json"
    assert init.sha256 == sha256_file(tmp_path / "txl-src" / "model.safetensors")


def test_init_vocab_may_name_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--init-vocab ptb``: the vocabulary of ptb's prepared cache; a dataset with none says what to run."""
    from tests.data.test_named_vocab import ptb_dir
    from transformer_xl.cli import main

    data = ptb_dir(tmp_path / "data")
    corpus = load_corpus("ptb", data)
    tiny_model(0, n_token=len(corpus.vocab), tgt_len=6, mem_len=6).save_pretrained(tmp_path / "m")  # no vocab beside
    trainer = Trainer(run_config(tmp_path / "run", "ptb", data_dir=str(data), init_from=str(tmp_path / "m"),
                                 init_vocab="ptb"))
    assert trainer.corpus.vocab.sha256() == corpus.vocab.sha256()
    trainer.close()
    assert open_init(tmp_path / "m", "ptb").record()["vocab"] == str(corpus.cache_dir / "vocab.json")
    capsys.readouterr()
    assert main(["train", "--dataset", "ptb", "--data-dir", str(data), "--init-from", str(tmp_path / "m"),
                 "--init-vocab", "wt103", "--out-dir", str(tmp_path / "r"), "--batch-size", "4"]) == 2
    err = one_line_error(capsys, "txl train: error: ")
    assert "--init-vocab wt103: no prepared vocabulary of wt103 yet; run `txl data prepare wt103` first" in err
