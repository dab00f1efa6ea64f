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


def test_samples_a_stop_string_did_not_end_go_on_after_one_it_did_end(tmp_path) -> None:
    """Several samples as a batch: the one that meets a stop string stops, the others run to their length."""
    vocab = Vocab(["<eos>", *"abcdefgh "], eos="<eos>")
    model, _ = _tiny(tmp_path, vocab)
    codec = TextCodec(vocab)
    free: list = []
    list(stream_text(model, codec, "ab", num_samples=3, results=free, max_new_tokens=30, do_sample=True, seed=4))
    texts = [r.text for r in free]
    # a stop string early in the first sample and nowhere in the other two
    stop = next(texts[0][i:i + n] for n in (2, 3, 4) for i in range(12)
                if texts[0][i:i + n] not in texts[1] and texts[0][i:i + n] not in texts[2])
    results: list = []
    pieces = list(stream_text(model, codec, "ab", num_samples=3, results=results, stop_strings=[stop],
                              max_new_tokens=30, do_sample=True, seed=4))
    assert results[0].finish_reason == "stop_string" and results[0].text == texts[0][:texts[0].index(stop)]
    for b in (1, 2):
        assert results[b].finish_reason == "length" and len(results[b].token_ids) == 30, results[b]
        assert results[b].text == texts[b]
        assert "".join(p.text for p in pieces if p.sample == b) == texts[b]


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


def _oracle(text: str, stops: list[str]) -> tuple[int | None, int]:
    """The earliest start of a stop string in ``text`` (None: none), else the longest end of ``text`` that begins
    one: every occurrence and every prefix compared (the old scan, slow and plainly right)."""
    hits = [text.find(s) for s in stops if s in text]
    if hits:
        return min(hits), 0
    return None, max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def test_the_stop_matcher_finds_what_comparing_everything_finds() -> None:
    """Random texts over two letters fed in random pieces, random stops (overlapping, periodic, one inside another):
    after every piece, the earliest stop found and the text held back are those of the whole text compared again."""
    import random

    from transformer_xl.inference.text import StopMatcher

    rng = random.Random(0)
    for _ in range(400):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        matcher, text = StopMatcher(stops), ""
        while True:
            piece = "".join(rng.choice("ab") for _ in range(rng.randint(0, 4)))
            text += piece
            end, want = matcher.feed(piece), _oracle(text, stops)
            if end is not None:
                assert (end, 0) == want, (stops, text)
                break
            assert (None, matcher.hold) == want, (stops, text)
    assert StopMatcher(["world", "hello"]).feed("say hello world") == 4  # the earliest, not the first listed
    assert StopMatcher(["bcd", "abcdef"]).feed("xabcdef") == 1  # found in one piece: the one that begins first
    with pytest.raises(ConfigError, match="must not be empty"):
        StopMatcher(["a", ""])


class _Counted(str):
    """A stop string that counts the characters read out of it (by index or slice)."""

    read = 0

    def __getitem__(self, key):  # type: ignore[override]
        out = str.__getitem__(self, key)
        _Counted.read += len(out)
        return out


def test_a_sample_compares_each_new_character_not_its_whole_text_with_long_stops() -> None:
    """Four stops of 2,001 characters that the text keeps almost beginning: the characters of the stops compared
    grow with the text generated (at most twice per new character and stop, once the sample is made), not with the
    text times the stops' length (the old scan compared every prefix of every stop at every token: 1.1 M here)."""
    from transformer_xl.inference.text import SampleText

    vocab = Vocab(["<eos>", "a", "b", "c", "d"], special=["<eos>"], eos="<eos>")
    stops = [_Counted("ab" * 1000 + end) for end in "cd"] + [_Counted("ba" * 1000 + end) for end in "cd"]
    text = SampleText(TextCodec(vocab, "char"), [], stops)
    _Counted.read = 0
    fed = 1500
    for i in range(fed):
        text.feed(1 + i % 2)  # "abab...": each stop's prefix ends the text
    assert text.text == "ab" * (fed // 2) and text.feed(1) == "" and not text.done  # all of it held back so far
    assert _Counted.read <= 4 * 2 * (2001 + fed + 1)
    assert text.feed(3) == "ab" * (fed // 2) + "ac" and not text.done  # no stop can begin there: all released
