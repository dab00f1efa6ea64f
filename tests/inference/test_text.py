"""Text generation: prompts in, text out as it becomes final; stop strings cut and held back."""

from __future__ import annotations

import pytest

from tests.helpers import model_dir_with_vocab as _tiny
from transformer_xl import ConfigError
from transformer_xl.data import Vocab
from transformer_xl.data.codec import TextCodec
from transformer_xl.inference.text import stream_text


def test_stream_text_stop_strings_are_cut_and_held_back(tmp_path) -> None:
    vocab = Vocab(["<eos>", *"abcdefgh "], eos="<eos>")
    model, _ = _tiny(tmp_path, vocab)
    codec = TextCodec(vocab)
    free: list = []
    list(stream_text(model, codec, "ab", results=free, max_new_tokens=30, do_sample=True, seed=4))
    text = free[0].text
    stop = text[10:12]
    results: list = []
    pieces = list(stream_text(model, codec, "ab", results=results, stop_strings=[stop], max_new_tokens=30,
                              do_sample=True, seed=4))
    assert results[0].finish_reason == "stop_string"
    assert results[0].text == text[:text.index(stop)]
    assert "".join(p.text for p in pieces) == results[0].text
    with pytest.raises(ConfigError, match="stop token"):
        list(stream_text(model, codec, "ab", stop_tokens=["<nope>"]))


def test_sample_text_holds_back_what_may_begin_a_stop_string() -> None:
    from transformer_xl.inference.text import SampleText

    vocab = Vocab(["<eos>", "a", "b", "c"], special=["<eos>"], eos="<eos>")
    text = SampleText(TextCodec(vocab, "char"), [1], ["bc"])
    assert text.feed(1) == "a" and text.feed(2) == "" and not text.done  # "b" may begin "bc"
    assert text.feed(1) == "ba"
    assert text.feed(2) == "" and text.feed(3) == "" and text.done and text.finish_reason == "stop_string"
    assert text.text == "aba" and text.close() == ""
    rest = SampleText(TextCodec(vocab, "char"), [], ["bc"])
    rest.feed(2)
    assert rest.close() == "b" and rest.finish_reason == "length"
