"""``TransfoXLTokenizerFast``: the ids ``txl score`` gives a text, for any text, at every level; padding; saving and
loading back (directly and through ``AutoTokenizer``); decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.17")
pytest.importorskip("tokenizers")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import SHARED_DATA, needs_shared_data, word_vocab
from transformer_xl.data import Vocab, load_corpus
from transformer_xl.errors import DataError
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.integrations.hf.tokenizer import MODEL_MAX_LENGTH, TransfoXLTokenizerFast, tokenizer_from_model_dir

#: Every kind of whitespace ``str.split`` knows, the file separators \x1c-\x1f (not whitespace to Rust) included.
WHITESPACE = ["\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", " ", "\x85", "\xa0", "\u1680", "\u2000", "\u200a",
              "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
LINE_ENDS = ["\n", "\r\n", "\r", "\n\n", " \n ", "\r\r\n"]
LITERALS = ["<eos>", "<pad>", "<unk>", "<mask>", "<eos", "eos>", "THE", "The", "\u03a3", "\u0391\u03a3", "\u03c2",
            "\u0130", "\ua7cb", "\u1c89", "\xe9", "E\u0301", "_", "10", "\ufffd", "\U0001f600"]
SETTINGS = settings(max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def texts(symbols: list[str]) -> st.SearchStrategy[str]:
    """Text made of the vocabulary's symbols (as they are and upper-cased), random unicode, every whitespace kind,
    line ends, and the special symbols written out; glued or spaced."""
    piece = st.one_of(st.sampled_from(symbols), st.sampled_from(symbols).map(str.upper), st.text(max_size=4),
                      st.sampled_from(WHITESPACE).map(lambda w: w * 2), st.sampled_from(WHITESPACE),
                      st.sampled_from(LINE_ENDS), st.sampled_from(LITERALS))
    glue = st.sampled_from(["", " ", "", "  ", "\t"])
    return st.lists(st.tuples(piece, glue), max_size=14).map(lambda ps: "".join(a + b for a, b in ps))


def _greek_lower() -> LineEncoder:
    """A lower-case word vocabulary where final sigma matters (``ας`` vs ``ασ``) and ``İ`` lowers to two code points."""
    return LineEncoder(Vocab(["<eos>", "<unk>", "the", "\u03b1\u03c2", "\u03b1\u03c3", "\u03c3\u03b1\u03c2",
                              "i\u0307", "\xe9", "<pad>x"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>"))


def _char() -> LineEncoder:
    syms = ["<eos>", "<unk>", "\n", " ", "\t", "\x1c", "a", "b", "e", "\xe9", "\u03c3", "\u03c2", "<", ">", "_"]
    return LineEncoder(Vocab(syms, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>"), level="char")


def _subword(tmp: Path, kind: str, eos: str | None = "<eos>") -> LineEncoder:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "wordlevel":  # the end-of-line symbol is a word of the vocabulary, not an added token
        tok = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2, "<eos>": 3, "the": 4}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    else:  # a byte-level BPE, as `--tokenizer` models are usually trained
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=kind == "bpe-prefix")
        tok.decoder = decoders.ByteLevel()
        corpus = ["the cat sat on the mat", "a dog ran under a log", "Ünïcödé wörds here", "one <eos> two"] * 10
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>", "<unk>", "<mask>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp / f"{kind}.json"
    tok.save(str(path))
    syms = [tok.id_to_token(i) for i in range(tok.get_vocab_size(with_added_tokens=True))]
    return LineEncoder(Vocab(syms, eos=eos, unk="<unk>" if "<unk>" in syms else None), tokenizer=path)


ENCODERS = {
    "word-greek-lower": lambda tmp: _greek_lower(),
    "word-no-unk": lambda tmp: LineEncoder(Vocab(["<eos>", "the", "cat", "a"], eos="<eos>")),
    "char": lambda tmp: _char(),
    "char-newline-symbol": lambda tmp: LineEncoder(Vocab(["\n", " ", "a", "b", "\xe9"]), level="char"),
    "text8": lambda tmp: LineEncoder(Vocab(["_", *"abcdefghijklmnopqrstuvwxyz"])),
    "byte": lambda tmp: LineEncoder(Vocab([str(b) for b in range(256)])),
    "byte-enwik8-like": lambda tmp: LineEncoder(Vocab([str(b) for b in range(256) if b not in (10, 0xE9, 0x80)])),
    "subword-wordlevel": lambda tmp: _subword(tmp, "wordlevel"),
    "subword-bpe": lambda tmp: _subword(tmp, "bpe"),
    "subword-bpe-prefix": lambda tmp: _subword(tmp, "bpe-prefix"),
    "subword-bpe-no-eos": lambda tmp: _subword(tmp, "bpe-prefix", eos=None),  # lines joined with nothing between
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[LineEncoder, TransfoXLTokenizerFast]]:
    tmp = tmp_path_factory.mktemp("tok")
    out = {}
    for name, make in ENCODERS.items():
        enc = make(tmp)
        out[name] = (enc, TransfoXLTokenizerFast.from_encoder(enc))
    return out


@pytest.fixture(scope="module")
def wt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[LineEncoder, TransfoXLTokenizerFast]:
    vocab = load_corpus("wt2", SHARED_DATA, cache_dir=tmp_path_factory.mktemp("cache")).vocab
    enc = LineEncoder(vocab)
    return enc, TransfoXLTokenizerFast.from_encoder(enc)


def _same_ids(enc: LineEncoder, tok: TransfoXLTokenizerFast, text: str) -> None:
    """The tokenizer's ids are the encoder's (or both refuse: a symbol outside a vocabulary without ``<unk>``)."""
    try:
        want = enc.string_ids(text)
    except DataError:
        with pytest.raises(DataError, match="not in the model's vocabulary, which has no unknown symbol"):
            tok(text, add_special_tokens=False)
        return
    got = tok(text, add_special_tokens=False).input_ids
    assert got == want, repr(text)
    assert tok.pad_token_id == len(enc.vocab) and tok.pad_token_id not in got
    start = enc.start_ids() if tok.bos_token is not None else []
    assert tok(text).input_ids == start + want


@pytest.mark.parametrize("name", list(ENCODERS))
@SETTINGS
@given(data=st.data())
def test_any_text_gets_the_ids_txl_score_gives_it(built, name: str, data: st.DataObject) -> None:
    enc, tok = built[name]
    _same_ids(enc, tok, data.draw(texts(enc.vocab.idx2sym[:400]), label="text"))


@needs_shared_data
@SETTINGS
@given(data=st.data())
def test_any_text_gets_the_wikitext2_ids(wt2, data: st.DataObject) -> None:
    enc, tok = wt2
    _same_ids(enc, tok, data.draw(texts(enc.vocab.idx2sym), label="text"))


def test_the_named_cases_and_the_start_symbol(built) -> None:
    enc, tok = built["word-greek-lower"]
    for text in ["", "\n", "THE \u0391\u03a3\n\u03a3\u0391\u03a3 \u0130", "the\x1cthe\r\nthe\rthe",
                 " <pad> <eos> <unk>", "\u0391\u03a3'\u03b1", "\u0391'\u03a3", "the\u2028the\x85the"]:
        _same_ids(enc, tok, text)
    assert tok("the \u0391\u03a3").input_ids == [0, 2, 3]  # <eos> first: every word is scored after it
    assert tok.bos_token == tok.eos_token == "<eos>" and tok.unk_token == "<unk>" and tok.pad_token == "<pad>"
    assert tok("<pad>", add_special_tokens=False).input_ids == [1]  # literally "<pad>" is an unknown word


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_batch_is_padded_with_the_new_pad_id_and_masked(side: str) -> None:
    enc = LineEncoder(word_vocab())
    tok = TransfoXLTokenizerFast.from_encoder(enc)
    n, the, game = len(enc.vocab), enc.vocab.sym2idx["the"], enc.vocab.sym2idx["game"]
    out = tok(["the game", "the"], padding=True, padding_side=side)
    pad_row = [0, the, n] if side == "right" else [n, 0, the]
    assert out.input_ids == [[0, the, game], pad_row]
    assert out.attention_mask == [[1, 1, 1], [1, 1, 0] if side == "right" else [0, 1, 1]]
    assert tok.padding_side == "right" and tok.model_max_length == MODEL_MAX_LENGTH
    assert tok.model_input_names == ["input_ids", "attention_mask"] and "token_type_ids" not in out


def test_save_and_load_back_identical_without_pickle(tmp_path, built) -> None:
    for name in ("char", "byte", "subword-bpe"):
        enc, tok = built[name]
        tok(["x", "xy"], padding=True)  # leaves padding on the backend: not saved
        out = tmp_path / name
        tok.save_pretrained(out)
        assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
        config = json.loads((out / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "TransfoXLTokenizerFast" and config["split_special_tokens"] is True
        back = TransfoXLTokenizerFast.from_pretrained(out)
        assert type(back) is TransfoXLTokenizerFast and back.special_tokens_map == tok.special_tokens_map
        tok(["x"])
        assert back.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
        assert back.padding_side == "right" and back.model_max_length == MODEL_MAX_LENGTH and back.split_special_tokens
        text = "a\x1cb <pad> \xe9\r\n_ <eos>\n"
        assert back(text).input_ids == tok(text).input_ids == enc.start_ids() + enc.string_ids(text)


def test_auto_tokenizer_loads_it_back(tmp_path) -> None:
    """``AutoTokenizer`` finds the class by the name ``tokenizer_config.json`` records, once ``AutoTokenizer.register``
    has seen it (here with a stand-in config; ``transformer_xl.hf`` registers it with ``TransfoXLConfig``)."""
    from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

    class StandIn(PretrainedConfig):
        model_type = "txl-test-tokenizer"

    AutoConfig.register(StandIn.model_type, StandIn, exist_ok=True)
    AutoTokenizer.register(StandIn, fast_tokenizer_class=TransfoXLTokenizerFast, exist_ok=True)
    enc = LineEncoder(word_vocab())
    TransfoXLTokenizerFast.from_encoder(enc).save_pretrained(tmp_path / "by-name")
    by_name = AutoTokenizer.from_pretrained(tmp_path / "by-name")
    StandIn().save_pretrained(tmp_path / "by-config")  # a model directory: config.json beside the tokenizer
    TransfoXLTokenizerFast.from_encoder(enc).save_pretrained(tmp_path / "by-config")
    by_config = AutoTokenizer.from_pretrained(tmp_path / "by-config")
    for tok in (by_name, by_config):
        assert type(tok) is TransfoXLTokenizerFast
        assert tok("the game\n<pad>").input_ids == [0, *enc.string_ids("the game\n<pad>")]


def test_decoding_reads_as_text_and_skipping_drops_only_the_pad(built) -> None:
    enc = LineEncoder(word_vocab())
    tok = TransfoXLTokenizerFast.from_encoder(enc)
    ids = tok(["the game\nthe", "the"], padding=True).input_ids
    assert tok.decode(ids[0]) == "\nthe game\nthe"  # the start symbol is <eos>: a newline
    assert tok.decode(ids[1]) == "\nthe <pad> <pad> <pad>" and tok.decode(ids[1], skip_special_tokens=True) == "\nthe"
    char_enc, char_tok = built["char"]
    assert char_tok.decode(char_enc.string_ids("a b\n\xe9a")) == "a b\n\xe9a"
    byte_enc, byte_tok = built["byte"]
    assert byte_tok.decode(byte_enc.string_ids("d\xe9j\xe0 vu\n\U0001f600")) == "d\xe9j\xe0 vu\n\U0001f600"
    text8_enc, text8_tok = built["text8"]
    assert text8_tok.decode(text8_enc.string_ids("Two  words\nmore")) == "two  wordsmore"
    bpe_enc, bpe_tok = built["subword-bpe"]
    assert bpe_tok.decode(bpe_enc.string_ids("the cat\na dog")) == "the cat\na dog"


def test_a_symbol_outside_a_vocabulary_without_unk_is_a_data_error() -> None:
    tok = TransfoXLTokenizerFast.from_encoder(LineEncoder(Vocab(["<eos>", "the"], eos="<eos>")))
    assert tok.unk_token is None and tok("the\nthe").input_ids == [0, 1, 0, 1]
    with pytest.raises(DataError, match=r"^the text has a symbol that is not in the model's vocabulary, which has no "
                                        r"unknown symbol$"):
        tok(["the", "the cat"])


def test_tokenizer_from_model_dir_reads_the_runs_level(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    Vocab(["<eos>", "_", "a", "b"], special=["<eos>"], eos="<eos>").save(run / "vocab.json")
    (run / "config.json").write_text(json.dumps({"train": {"level": "char"}}))
    tok = tokenizer_from_model_dir(run)
    assert tok("a_b\nb", add_special_tokens=False).input_ids == [2, 1, 3, 0, 3]  # "_" a character, not a space
    assert tokenizer_from_model_dir(run, level="text8")("a b\nb", add_special_tokens=False).input_ids == [2, 1, 3, 3]
