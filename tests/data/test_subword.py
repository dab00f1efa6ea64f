"""Subword corpora from a tokenizers JSON: given splits, line-end cuts, no eos token."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_xl.data.builders import Source
from transformer_xl.errors import DataError


def _tokenizer(path: Path, with_eos: bool) -> Path:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "one": 1, "two": 2, **({"<eos>": 3} if with_eos else {})}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def test_given_splits_are_encoded_each_and_a_stream_is_cut_at_line_ends(tmp_path: Path) -> None:
    from transformer_xl.data.subword import build_with_tokenizer

    tok = _tokenizer(tmp_path / "tok.json", with_eos=True)
    files = {}
    for split, text in (("train", "one two\none\n"), ("valid", "two\n"), ("test", "one one\n")):
        (tmp_path / f"{split}.txt").write_text(text)
        files[split] = [Source(tmp_path / f"{split}.txt")]
    built = build_with_tokenizer("t", files, tok)
    assert {k: v.tolist() for k, v in built.splits.items()} == {"train": [1, 2, 3, 1, 3], "valid": [2, 3],
                                                                "test": [1, 1, 3]}
    (tmp_path / "all.txt").write_text("one two one two\none\ntwo\none two\n")  # 12 tokens
    # cuts at 6 and 9 move to the line ends: 7 and 9
    cut = build_with_tokenizer("t", [Source(tmp_path / "all.txt")], tok, valid_fraction=0.25, test_fraction=0.25)
    assert [cut.splits[s].tolist() for s in ("train", "valid", "test")] == [[1, 2, 1, 2, 3, 1, 3], [2, 3],
                                                                             [1, 2, 3]]


def test_without_an_eos_token_the_cut_is_by_token(tmp_path: Path) -> None:
    from transformer_xl.data.subword import build_with_tokenizer

    tok = _tokenizer(tmp_path / "tok.json", with_eos=False)
    (tmp_path / "all.txt").write_text("one two one two one\ntwo one two one two\n")
    built = build_with_tokenizer("t", [Source(tmp_path / "all.txt")], tok, valid_fraction=0.2, test_fraction=0.2)
    assert [built.splits[s].size for s in ("train", "valid", "test")] == [6, 2, 2]
    with pytest.raises(DataError, match="not a tokenizers JSON"):
        build_with_tokenizer("t", [Source(tmp_path / "all.txt")], tmp_path / "all.txt")


def test_subword_codec_encodes_lines_and_streams_text_back(tmp_path: Path) -> None:
    from transformer_xl.data.subword import SubwordCodec
    from transformer_xl.data.vocab import Vocab

    tok = _tokenizer(tmp_path / "tok.json", with_eos=True)
    vocab = Vocab(["<unk>", "one", "two", "<eos>"], eos="<eos>")
    codec = SubwordCodec(vocab, tok)
    assert codec.encode("one two\ntwo") == [1, 2, 3, 2] and codec.encode("") == [3]
    dec = codec.decoder(codec.encode("one"))  # the prompt prints nothing
    assert dec.feed([2]) + dec.feed([1, 3]) + dec.feed([2]) + dec.flush() == " two one\ntwo"
    assert codec.decode([1, 2, 3, 1]) == "one two\none"
    with pytest.raises(DataError, match="not the tokenizer of this model's vocabulary"):
        SubwordCodec(Vocab(["<unk>", "two", "one", "<eos>"], eos="<eos>"), tok)
