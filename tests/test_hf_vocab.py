"""Hugging Face TransfoXL vocabulary pickles read without running code (txl.hf_vocab), and convert."""

from __future__ import annotations

import json
import os
import pickle
import re
from collections import Counter, OrderedDict

import pytest
import torch

from txl import CheckpointError, TransformerXLLM, TXLConfig
from txl._cli import main
from txl.data import Vocab
from txl.hf_vocab import load_hf_vocab, read_hf_vocab_dict, restricted_loads

SYMS = ["<eos>", "the", ",", ".", "of", "<unk>", "and", "@-@", "Valkyria", "é"]


def _tokenizer_dict() -> dict:
    """What TransfoXLTokenizer.save_vocabulary pickles (its __dict__), for a small vocabulary."""
    return {
        "counter": Counter({s: 100 - i for i, s in enumerate(SYMS[1:])}),
        "special": ["<eos>"], "min_freq": 0, "max_size": None, "lower_case": False, "delimiter": None,
        "vocab_file": None, "never_split": ("<unk>", "<eos>", "<formula>"),
        "idx2sym": list(SYMS), "sym2idx": OrderedDict((s, i) for i, s in enumerate(SYMS)),
        "eos_idx": 0, "unk_idx": 5,
    }


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


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


def _hf_dir(tmp_path, vocab_obj) -> str:
    torch.manual_seed(0)
    model = TransformerXLLM(TXLConfig(n_token=len(SYMS), n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32))
    assert main(["convert", "--to", "hf", str(model.save_pretrained(tmp_path / "ours")), "--out",
                 str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "vocab.pkl").write_bytes(pickle.dumps(vocab_obj))
    return str(tmp_path / "hf")


def test_convert_from_hf_writes_json_vocab(tmp_path, capsys) -> None:
    hf = _hf_dir(tmp_path, _tokenizer_dict())
    assert main(["convert", "--from", "hf", hf, "--out", str(tmp_path / "m")]) == 0
    assert "vocabulary (10 symbols)" in capsys.readouterr().out
    vocab = Vocab.load(tmp_path / "m" / "vocab.json")
    assert vocab.idx2sym == SYMS and json.loads((tmp_path / "m" / "vocab.json").read_text())["eos"] == "<eos>"


def test_convert_refuses_hostile_vocab_before_writing(tmp_path, capsys) -> None:
    marker = tmp_path / "pwned"
    hf = _hf_dir(tmp_path, {**_tokenizer_dict(), "x": _Evil(str(marker))})
    capsys.readouterr()
    assert main(["convert", "--from", "hf", hf, "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl convert: error:") and "system" in err and err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "m").exists()
