"""Hugging Face TransfoXL vocabulary pickles read without running code (transformer_xl.interop.hf_vocab)."""

from __future__ import annotations

import pickle
import re
from collections import Counter, OrderedDict

import pytest
import torch

from tests.helpers import HF_SYMS as SYMS
from tests.helpers import HostilePickle as _Evil
from tests.helpers import hf_tokenizer_dict as _tokenizer_dict
from transformer_xl import CheckpointError
from transformer_xl.data import Vocab
from transformer_xl.interop.hf_vocab import (
    HF_TOKENIZER_FILES,
    hf_tokenizer_files,
    hf_tokenizer_refusal,
    load_hf_vocab,
    read_hf_vocab_dict,
    restricted_loads,
)


class _EvalEvil:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


@pytest.mark.parametrize("protocol", [0, 2, 4, pickle.HIGHEST_PROTOCOL])
def test_benign_vocab_pickle_is_read(tmp_path, protocol) -> None:
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(_tokenizer_dict(), protocol=protocol))
    d = read_hf_vocab_dict(path)
    assert isinstance(d["counter"], Counter) and isinstance(d["sym2idx"], OrderedDict)
    vocab = load_hf_vocab(tmp_path)
    assert vocab.idx2sym == SYMS and vocab.eos == "<eos>" and vocab.unk == "<unk>" and vocab.special == ["<eos>"]


def test_torch_saved_vocab_both_formats(tmp_path) -> None:
    """The published transfo-xl-wt103 vocabulary is a torch.save'd dict (legacy format: pickled magic number
    first, which is why plain pickle.load returns an int); newer torch writes a zip."""
    for legacy in (True, False):
        path = tmp_path / f"vocab{legacy}.bin"
        torch.save(_tokenizer_dict(), path, _use_new_zipfile_serialization=not legacy)
        if legacy:
            assert isinstance(pickle.loads(path.read_bytes()), int)
        assert load_hf_vocab(path).idx2sym == SYMS


def test_newer_transformers_dict_with_regex_objects_loads(tmp_path) -> None:
    d = _tokenizer_dict()
    d["punction_without_space_before_pattern"] = re.compile(r"[^\s][!?]")
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(d))
    assert load_hf_vocab(path).idx2sym == SYMS


@pytest.mark.parametrize("where", ["top", "nested"])
def test_hostile_pickle_is_refused_and_never_runs(tmp_path, where) -> None:
    marker = tmp_path / "pwned"
    evil = _Evil(str(marker))
    obj = evil if where == "top" else {**_tokenizer_dict(), "counter": [evil]}
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(obj))
    with pytest.raises(CheckpointError, match=r"(posix|os|nt)\.system.*refuses to run code"):
        load_hf_vocab(path)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"builtins\.eval"):
        restricted_loads(pickle.dumps(_EvalEvil()))
    with pytest.raises(CheckpointError, match="torch"):  # tensors: torch._utils rebuild functions
        torch.save({"idx2sym": SYMS, "t": torch.zeros(2)}, tmp_path / "t.bin", _use_new_zipfile_serialization=False)
        load_hf_vocab(tmp_path / "t.bin")
    assert not marker.exists()


def test_malformed_files_give_clear_errors(tmp_path) -> None:
    (tmp_path / "a.pkl").write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match="not a readable pickle"):
        load_hf_vocab(tmp_path / "a.pkl")
    (tmp_path / "b.pkl").write_bytes(pickle.dumps(["just", "a", "list"]))
    with pytest.raises(CheckpointError, match="tokenizer dict"):
        load_hf_vocab(tmp_path / "b.pkl")
    (tmp_path / "c.pkl").write_bytes(pickle.dumps({"counter": Counter()}))
    with pytest.raises(CheckpointError, match="idx2sym"):
        load_hf_vocab(tmp_path / "c.pkl")




# ------------------------------------------------------------------ writing TransfoXLTokenizer files
def test_hf_tokenizer_files_hold_the_vocabulary_and_its_special_tokens() -> None:
    import json

    from tests.helpers import word_vocab

    vocab = word_vocab()
    files = hf_tokenizer_files(vocab)
    assert tuple(files) == HF_TOKENIZER_FILES
    assert files["vocab.txt"].splitlines() == vocab.idx2sym
    config = json.loads(files["tokenizer_config.json"])
    assert config["tokenizer_class"] == "TransfoXLTokenizer" and config["lower_case"] is False
    assert config["unk_token"] == "<unk>" and config["eos_token"] == "<eos>"
    assert config["additional_special_tokens"] == []
    assert {"<unk>", "<eos>", "@[-,.]@"} <= set(config["never_split"])
    assert json.loads(files["special_tokens_map.json"]) == {"unk_token": "<unk>", "eos_token": "<eos>",
                                                            "additional_special_tokens": []}
    lower = Vocab(["<eos>", "<unk>", "the", "cat"], special=["<eos>"], eos="<eos>", unk="<unk>")
    assert json.loads(hf_tokenizer_files(lower)["tokenizer_config.json"])["lower_case"] is True  # as TextCodec


@pytest.mark.parametrize("vocab, reason", [
    (Vocab(["<unk>", "a b", "c"], unk="<unk>"), "the symbol 'a b', which a one-symbol-a-line vocab.txt cannot hold"),
    (Vocab(["<unk>", "", "cat"], unk="<unk>"), "the symbol '', which"),
    (Vocab(["<eos>", "cat", "dog"], eos="<eos>"), "maps unknown words to <unk> or <UNK>, the vocabulary's unknown "
                                                  "symbol is None"),
    (Vocab(["<oov>", "cat", "dog"], unk="<oov>"), "symbol is <oov>"),
    (Vocab(["<UNK>", "<unk>", "cat"], unk="<unk>"), "maps unknown words to <UNK>"),
    (Vocab(["<eos>", "<unk>", "a", "b", " "], eos="<eos>", unk="<unk>"), "the vocabulary is char-level"),
    (Vocab([str(b) for b in range(256)]), "the vocabulary is byte-level"),
])
def test_hf_tokenizer_refuses_what_its_vocab_file_cannot_hold(vocab, reason: str) -> None:
    assert reason in hf_tokenizer_refusal(vocab)
    with pytest.raises(CheckpointError, match=re.escape(reason)):
        hf_tokenizer_files(vocab)
