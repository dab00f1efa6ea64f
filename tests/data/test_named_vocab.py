"""Vocabulary flags that name a dataset: the vocab.json of its prepared cache; a path wins; one line otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_xl.data import Vocab, load_corpus
from transformer_xl.data.named_vocab import dataset_vocab, is_dataset_name, resolve_vocab
from transformer_xl.errors import DataError


def ptb_dir(root: Path, words: int = 58) -> Path:
    """A data dir whose ``ptb/`` holds three small files: ``words`` distinct words, ``<unk>`` and ``<eos>``."""
    folder = root / "ptb"
    folder.mkdir(parents=True)
    text = " ".join(f"w{i}" for i in range(words)) + " <unk>"
    for split in ("train", "valid", "test"):
        (folder / f"ptb.{split}.txt").write_text(f" {text} \n w1 w2 \n")
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


def test_a_dataset_name_is_the_vocabulary_of_its_prepared_cache(tmp_path: Path) -> None:
    corpus = load_corpus("ptb", ptb_dir(tmp_path / "data"))
    assert dataset_vocab("ptb") == corpus.cache_dir / "vocab.json"
    assert resolve_vocab("penn", flag="--init-vocab") == corpus.cache_dir / "vocab.json"  # aliases too
    assert Vocab.load(resolve_vocab("PTB")).sha256() == corpus.vocab.sha256()
    # a cache encoded with a given vocabulary (a fine-tuning run's) is not the dataset's own
    other = Vocab(["<eos>", "<unk>", *(f"w{i}" for i in range(10))], unk="<unk>")
    encoded = load_corpus("ptb", tmp_path / "data", vocab=other)
    assert encoded.cache_dir != corpus.cache_dir and dataset_vocab("ptb") == corpus.cache_dir / "vocab.json"


def test_an_existing_path_wins_over_a_name(tmp_path: Path) -> None:
    (tmp_path / "wt103").write_text("{}")
    assert not is_dataset_name("wt103") and resolve_vocab("wt103") == Path("wt103")
    assert resolve_vocab(tmp_path / "v.json") == tmp_path / "v.json" and resolve_vocab(None) is None
    assert is_dataset_name("wikitext-103") and not is_dataset_name("no-such-dataset")


def test_a_name_without_a_prepared_cache_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        resolve_vocab("wikitext-103", flag="--init-vocab")
    assert str(err.value) == ("--init-vocab wikitext-103: no prepared vocabulary of wt103 yet; run `txl data prepare "
                              "wt103` first (or give the path of a vocabulary file)")
