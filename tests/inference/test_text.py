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
