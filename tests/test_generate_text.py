"""Prompt encoding / detokenization (txl.textcodec) and the ``txl generate`` command."""

from __future__ import annotations

import json

import pytest
import torch

from txl import ConfigError, TransformerXLLM, TXLConfig
from txl._cli import main
from txl.data import Vocab
from txl.textcodec import PromptWarning, TextCodec, detect_level, stream_text

WORDS = ["<eos>", "<unk>", "the", "game", "was", "well", "@-@", "known", ",", ".", "1", "@,@", "000", "(", ")",
         "'s", "=", "It", "n't", "do"]


def _word_vocab() -> Vocab:
    return Vocab(WORDS, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")


def test_detect_level() -> None:
    assert detect_level(_word_vocab()) == "word"
    assert detect_level(Vocab(["<eos>", "a", "b", " "], eos="<eos>")) == "char"
    assert detect_level(Vocab(list("abcdefghijklmnopqrstuvwxyz_"))) == "text8"
    assert detect_level(Vocab([str(b) for b in (32, 101, 200, 0)])) == "byte"


def test_word_detokenization_and_prompt_tokenization() -> None:
    codec = TextCodec(_word_vocab())
    syms = ["=", "the", "game", "=", "<eos>", "It", "'s", "well", "@-@", "known", "(", "1", "@,@", "000", ")",
            ",", "do", "n't", ".", "<eos>", "the"]
    ids = [codec.vocab.sym2idx[s] for s in syms]
    assert codec.decode(ids) == "= the game =\nIt's well-known (1,000), don't.\nthe"
    with pytest.warns(PromptWarning, match="zzz"):
        enc = codec.encode("The well-known game (1,000) zzz.\nIt")
    assert codec.vocab.decode(enc) == ["<unk>", "well", "@-@", "known", "game", "(", "1", "@,@", "000", ")",
                                       "<unk>", ".", "<eos>", "It"]  # cased vocabulary: "The" is unknown
    lower = TextCodec(Vocab([s.lower() for s in WORDS], eos="<eos>", unk="<unk>"))
    assert lower.vocab.decode(lower.encode("The game"))[0] == "the"  # lower-cased vocabulary: prompt lowered
    assert codec.encode("") == [codec.vocab.eos_idx]  # empty prompt: start of a line


def test_char_text8_and_byte_levels() -> None:
    char = TextCodec(Vocab(["<eos>", "a", "b", " "], eos="<eos>"))
    with pytest.warns(PromptWarning, match="dropped"):
        ids = char.encode("ab x\nb")
    assert char.decode(ids) == "ab \nb"
    t8 = TextCodec(Vocab(list("abcdefghijklmnopqrstuvwxyz_")))
    assert t8.decode(t8.encode("Hello World")) == "hello world"
    byte_vocab = Vocab([str(b) for b in range(256)])
    byte = TextCodec(byte_vocab)
    ids = byte.encode("héllo €")
    assert byte.decode(ids) == "héllo €"
    dec = byte.decoder()  # a character split over two steps is printed once complete
    euro = "€".encode()
    assert dec.feed([euro[0]]) == "" and dec.feed([euro[1]]) == "" and dec.feed([euro[2]]) == "€"
    assert byte.decode([0xFF, 0x41]) == "\ufffdA"  # invalid UTF-8 -> U+FFFD
    assert byte.decode([0xE2, 0x82]) == "\ufffd"  # truncated at the end
    enwik8_like = TextCodec(Vocab([str(b) for b in (32, 104, 105)]))  # no newline byte, no <unk>
    with pytest.warns(PromptWarning, match="bytes"):
        assert enwik8_like.decode(enwik8_like.encode("hi\nhi")) == "hihi"
    assert enwik8_like.encode("") == [0]  # no <eos>: start from a space


def _tiny(tmp_path, vocab: Vocab, seed: int = 0):
    torch.manual_seed(seed)
    model = TransformerXLLM(TXLConfig(n_token=len(vocab), n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32,
                                      tgt_len=4, mem_len=4, init_std=0.3))
    model.save_pretrained(tmp_path / "m")
    vocab.save(tmp_path / "m" / "vocab.json")
    return model, tmp_path / "m"


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


def test_cli_generate_text_json_stream_and_errors(tmp_path, capsys) -> None:
    _, model_dir = _tiny(tmp_path, _word_vocab())
    assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "12", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the game") and len(out) > len("the game\n")
    assert main(["generate", str(model_dir), "--prompt", "the game zzz", "--max-new-tokens", "6", "--json",
                 "--num-samples", "3", "--top-k", "5", "--stop-token", "<eos>"]) == 0
    cap = capsys.readouterr()
    assert "zzz" in cap.err and "warning" in cap.err
    doc = json.loads(cap.out)
    assert len(doc["samples"]) == 3 and doc["prompt_ids"][-1] == 1  # zzz -> <unk>
    for s in doc["samples"]:
        assert len(s["token_ids"]) == len(s["log_probs"]) == len(s["tokens"]) <= 6
        assert all(lp <= 0 for lp in s["log_probs"])
    assert main(["generate", str(model_dir), "--max-new-tokens", "5", "--stream", "--greedy"]) == 0
    streamed = capsys.readouterr().out
    assert main(["generate", str(model_dir), "--max-new-tokens", "5", "--greedy"]) == 0
    assert capsys.readouterr().out == streamed
    for argv, msg in [(["--top-p", "0"], "top_p"), (["--max-new-tokens", "-3"], "max_new_tokens"),
                      (["--stream", "--num-samples", "2"], "--stream"), (["--vocab", str(tmp_path / "no.json")],
                                                                          "cannot read vocabulary")]:
        assert main(["generate", str(model_dir), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("txl generate: error:") and msg in err and err.count("\n") == 1
    (model_dir / "vocab.json").unlink()
    assert main(["generate", str(model_dir)]) == 2
    assert "--vocab" in capsys.readouterr().err
