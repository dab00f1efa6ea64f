"""A Hugging Face ``tokenizers`` pipeline that gives text exactly the ids :class:`LineEncoder` gives it.

:func:`build_tokenizer` turns the rules of :mod:`transformer_xl.inference.lines` (what ``txl score`` does to text)
into normalizers, pre-tokenizers and a ``WordLevel`` model whose keys are the model's ids, so that
``build_tokenizer(encoder).encode(text, add_special_tokens=False).ids == encoder.string_ids(text)`` for every ``str``:

* every level: ``\\r\\n`` and ``\\r`` become ``\\n``; where Python and Rust disagree the pipeline follows Python:
  whitespace is Python's ``str.isspace`` (``\\x1c``-``\\x1f`` included), lower-casing is ``str.lower`` (the
  final-sigma rule written as a regex, and the characters the two Unicode versions case differently refused or
  mapped to a symbol no vocabulary entry holds);
* ``word``: a newline becomes `` <eos> `` (the end-of-line symbol as a word), words split on Python whitespace;
* ``char`` / ``text8``: each line stripped, one token per character (``text8``: whitespace as ``_``, lines joined);
  the newline is the key of the end-of-line id;
* ``byte``: one token per UTF-8 byte, nothing stripped (keys are the byte-level pre-tokenizer's characters, so ``\\n``
  is the byte ``10``, dropped when the vocabulary lacks it);
* ``subword``: the model's own tokenizer run on each stripped line, the lines joined by its ``<eos>`` added token.

Special tokens never match text: a tokenizer built here has ``encode_special_tokens`` set (``tokenizers`` does not
save that flag; the transformers class sets it back from ``split_special_tokens``). A new ``<pad>`` takes the id one
past the vocabulary. A level that cannot be made exact is refused with a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

from transformer_xl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformer_xl.inference.lines import LineEncoder

__all__ = ["PAD_TOKEN", "build_tokenizer", "python_whitespace", "special_keys"]

PAD_TOKEN = "<pad>"
#: Normalizers of a subword tokenizer that act on each character alone, so a newline stays a line boundary.
LINE_LOCAL_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Sequence"}
#: Characters that stand for a character Python and Rust lower-case differently (one no vocabulary symbol has).
_STAND_INS = ("\ufffd", "\uffff", "\x00", "\U0010ffff")


@lru_cache(maxsize=1)
def python_whitespace() -> str:
    """Every character ``str.isspace`` (and so ``str.split``/``str.strip``) treats as whitespace."""
    return "".join(c for c in _all_chars() if c.isspace())


def _char_class(chars: str | set[str]) -> str:
    """An Oniguruma class matching exactly ``chars`` (as ``\\x{..}`` ranges, so no character needs escaping)."""
    points = sorted({ord(c) for c in chars})
    parts, i = [], 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        parts.append(f"\\x{{{points[i]:x}}}" + (f"-\\x{{{points[j]:x}}}" if j > i else ""))
        i = j + 1
    return "[" + "".join(parts) + "]"


@lru_cache(maxsize=1)
def _all_chars() -> str:
    """Every code point but NUL and the surrogates (which no ``str`` the Rust side reads can hold)."""
    return "".join(chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF)


def _lower_each(texts: list[str]) -> list[str]:
    """``[t.lower() for t in texts]`` in one call (NUL neither cased nor case-ignorable: no context crosses it)."""
    return "\x00".join(texts).lower().split("\x00")


@lru_cache(maxsize=1)
def _lowercase_differences() -> dict[str, str]:
    """Characters whose ``str.lower`` differs from the ``Lowercase`` normalizer's (the two Unicode versions differ),
    with Python's lower case."""
    chars = _all_chars()
    rust = normalizers.Lowercase().normalize_str("\x00".join(chars)).split("\x00")
    return {c: p for c, p, r in zip(chars, _lower_each(list(chars)), rust, strict=True) if p != r}


@lru_cache(maxsize=1)
def _final_sigma_pattern() -> str:
    """``Σ`` where ``str.lower`` makes it ``ς``: after a cased letter (case-ignorables between) and not before one.
    The two classes are read from Python itself: ``1XΣ`` ends in ``ς`` iff X is cased and not case-ignorable,
    ``AXΣ`` iff X is cased or case-ignorable."""
    chars = _all_chars()
    after_digit = _lower_each(["1" + c + "\u03a3" for c in chars])
    after_letter = _lower_each(["A" + c + "\u03a3" for c in chars])
    cased = {c for c, low in zip(chars, after_digit, strict=True) if low[-1] == "\u03c2"}
    ignorable = {c for c, low in zip(chars, after_letter, strict=True) if low[-1] == "\u03c2"} - cased
    c, i = _char_class(cased), _char_class(ignorable)
    return f"(?<={c}{i}*)\u03a3(?!{i}*{c})"


def _lower_steps(symbols: list[str]) -> list[Any]:
    """Normalizers that lower-case as Python's ``str.lower`` does, for a vocabulary of ``symbols``."""
    alphabet = set("".join(symbols))
    differ = _lowercase_differences()
    kept = {c for c, low in differ.items() if low == c}  # Python leaves them, Rust lowers them
    lowered = {c: low for c, low in differ.items() if low != c}
    unstable = {c for c, low in lowered.items() if normalizers.Lowercase().normalize_str(low) != low}
    if alphabet & kept or unstable:
        shown = ", ".join(f"U+{ord(c):04X}" for c in sorted(alphabet & kept | unstable)[:4])
        raise ConfigError(f"the vocabulary holds characters ({shown}) that Python {unicodedata.unidata_version} and "
                          "the tokenizers library lower-case differently; this vocabulary cannot be made exact")
    steps: list[Any] = []
    if alphabet & {"\u03c3", "\u03c2"}:  # otherwise σ and ς both miss the vocabulary: the rule cannot matter
        steps.append(normalizers.Replace(Regex(_final_sigma_pattern()), "\u03c2"))
    steps += [normalizers.Replace(c, low) for c, low in sorted(lowered.items())]
    if kept:  # a word holding one misses the vocabulary in Python: so does one holding a character none has
        steps.append(normalizers.Replace(Regex(_char_class(kept)), next(c for c in _STAND_INS if c not in alphabet)))
    return [*steps, normalizers.Lowercase()]


def _newline_steps() -> list[Any]:
    return [normalizers.Replace("\r\n", "\n"), normalizers.Replace("\r", "\n")]


def _strip_lines() -> Any:
    """Python's ``line.strip()`` on every line (the newlines themselves stay)."""
    ws = _char_class(set(python_whitespace()) - {"\n"})
    return normalizers.Replace(Regex(f"(?:\\A|(?<=\\n)){ws}+|{ws}+(?=\\n|\\z)"), "")


_EACH_CHAR = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")


def _word_decoder(eos: str | None) -> Any:
    """Tokens joined by spaces, the end-of-line token as a newline (no space around it)."""
    steps = [decoders.Replace(Regex(r"\A"), " ")]
    if eos is not None:
        steps.append(decoders.Replace(Regex(f"\\A {_escape(eos)}\\z"), "\n"))
    return decoders.Sequence([*steps, decoders.Fuse(), decoders.Replace("\n ", "\n"),
                              decoders.Replace(Regex(r"\A "), "")])


def _escape(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def _keys(symbols: list[str], reach: dict[str, int]) -> dict[str, int]:
    """``WordLevel`` keys of a level that cuts text into single characters: ``reach`` (what text turns into), then
    every other id under its symbol, or, where text could give that symbol (one character), under an escaped name."""
    keys = dict(reach)
    taken = set(reach.values())
    for i, sym in enumerate(symbols):
        if i in taken:
            continue
        key = sym if sym not in keys and len(sym) != 1 else f"<id {i}: {sym!r}>"
        while key in keys:
            key += "'"
        keys[key] = i
    return keys


def _level_parts(encoder: LineEncoder) -> tuple[dict[str, int], list[Any], Any, Any]:
    """Keys, normalizers, pre-tokenizer and decoder of a ``word``/``char``/``text8``/``byte`` encoder."""
    symbols, level, end = encoder.vocab.idx2sym, encoder.level, encoder.end_id
    steps = _newline_steps() + (_lower_steps(symbols) if encoder.lower else [])
    if level == "word":
        eos = None if end is None else symbols[end]
        if eos is not None:
            if not eos or any(c.isspace() for c in eos):
                raise ConfigError(f"the end-of-line symbol {eos!r} is not a word (empty or with whitespace)")
            steps.append(normalizers.Replace("\n", f" {eos} "))
        split = pre_tokenizers.Split(Regex(_char_class(python_whitespace()) + "+"), behavior="removed")
        return {s: i for i, s in enumerate(symbols)}, steps, split, _word_decoder(eos)
    if level == "byte":  # the line's bytes as they are: no stripping
        byte_of = {str(b): char for b, char in _byte_chars().items()}  # the symbols "0" to "255" LineEncoder looks up
        reach = {byte_of[s]: i for i, s in enumerate(symbols) if s in byte_of}
        if end is None:
            steps.append(normalizers.Replace("\n", ""))
        pre = pre_tokenizers.Sequence([ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
                                       _EACH_CHAR])
        return _keys(symbols, reach), steps, pre, decoders.ByteLevel()
    steps.append(_strip_lines())
    reach = {s: i for i, s in enumerate(symbols) if len(s) == 1}
    if end is None:
        steps.append(normalizers.Replace("\n", ""))
    elif len(symbols[end]) == 1:  # the end-of-line character itself: one key for its id
        steps.append(normalizers.Replace("\n", symbols[end]))
    else:
        reach["\n"] = end
    decoder = decoders.Fuse()
    if level == "text8":
        ws = _char_class(set(python_whitespace()) - {"\n"})
        steps.append(normalizers.Replace(Regex(ws), "_"))
        decoder = decoders.Sequence([decoders.Replace("_", " "), decoders.Fuse()])
    return _keys(symbols, reach), steps, _EACH_CHAR, decoder


@lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    """Byte value -> the character the byte-level pre-tokenizer writes for it (GPT-2's table: printable Latin-1
    bytes stand for themselves, the other 68 take the characters from U+0100 on, in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(0x100 + n) for n, b in enumerate(others)}}


def _types(spec: Any) -> set[str]:
    """The ``type`` of every component in a normalizer / pre-tokenizer JSON (sequences opened)."""
    if not isinstance(spec, dict):
        return set()
    inner = spec.get("normalizers") or spec.get("pretokenizers") or []
    return {str(spec.get("type"))}.union(*(_types(s) for s in inner))


def _prefixes_first_line_only(spec: Any) -> bool:
    if not isinstance(spec, dict):
        return False
    if spec.get("type") == "Metaspace" and str(spec.get("prepend_scheme", "")).lower() == "first":
        return True
    return any(_prefixes_first_line_only(s) for s in spec.get("pretokenizers") or [])


def _reaches_into(token: str, sep: str) -> bool:
    """Whether a match of ``token`` could swallow (part of) the line separator ``sep`` after it."""
    return sep in token or any(token.endswith(sep[:k]) for k in range(1, len(sep)))


def _subword_separator(spec: dict[str, Any], eos: str | None) -> str | None:
    """What a newline becomes before the tokenizer's own pipeline (``None``: lines are split by a pre-tokenizer);
    a one-line :class:`ConfigError` where the tokenizer would not give each line the ids it gives it alone."""
    added, norm = spec.get("added_tokens") or [], spec.get("normalizer")
    refuse = "the model's tokenizer cannot be run line by line exactly"
    if _types(norm) - LINE_LOCAL_NORMALIZERS:
        raise ConfigError(f"{refuse}: its normalizer ({', '.join(sorted(_types(norm)))}) may act across lines")
    if _prefixes_first_line_only(spec.get("pre_tokenizer")):
        raise ConfigError(f"{refuse}: its Metaspace pre-tokenizer (prepend_scheme 'first') prefixes only the "
                          "text's first piece, the line encoder every line")
    for t in added:
        if "\n" in t["content"] or "\r" in t["content"]:
            raise ConfigError(f"{refuse}: its added token {t['content']!r} holds a line break")
        if norm is not None and not t.get("normalized", True):
            raise ConfigError(f"{refuse}: its added token {t['content']!r} is matched before the normalizer, and "
                              "stripped lines cannot be")
    if eos is None:
        return None
    own = [t for t in added if t["content"] == eos]
    if own:
        sep = eos
        if own[0].get("single_word") or eos != eos.strip() or any(eos[:k] == eos[-k:] for k in range(1, len(eos))):
            raise ConfigError(f"{refuse}: its end-of-line token {eos!r} is single-word, has whitespace at an end, or "
                              "overlaps itself")
    elif (not added and spec["model"].get("type") == "WordLevel" and eos and not any(c.isspace() for c in eos)
          and (spec.get("pre_tokenizer") or {}).get("type") == "WhitespaceSplit"):
        sep = f" {eos} "  # a word-level tokenizer: the end-of-line symbol is a word of its own
    else:
        raise ConfigError(f"{refuse}: its end-of-line symbol {eos!r} is not one of its added tokens (only a plain "
                          "WordLevel + WhitespaceSplit tokenizer can do without)")
    edges_plain = all(c.isascii() and not (c.isalnum() or c == "_") for c in (sep[0], sep[-1]))
    for t in added:
        if t["content"] != eos and (_reaches_into(t["content"], sep) or (t.get("single_word") and not edges_plain)):
            raise ConfigError(f"{refuse}: its added token {t['content']!r} could match across a line end")
    return sep


def _subword_tokenizer(encoder: LineEncoder) -> Tokenizer:
    """The model's tokenizer with each line stripped as Python strips it and lines joined by the end-of-line id."""
    spec = json.loads(encoder.tokenizer.to_str())
    eos = encoder.vocab.eos if encoder.end_id is not None else None
    sep = _subword_separator(spec, eos)
    for t in spec.get("added_tokens") or []:  # matched after the line stripping; never skipped as "special"
        t["special"], t["normalized"] = False, True
    spec.update(padding=None, truncation=None, post_processor=None)
    tok = Tokenizer.from_str(json.dumps(spec))
    steps = [*_newline_steps(), _strip_lines(), *([tok.normalizer] if tok.normalizer is not None else [])]
    if sep is None:
        lines = pre_tokenizers.Split("\n", behavior="removed")
        tok.pre_tokenizer = lines if tok.pre_tokenizer is None else pre_tokenizers.Sequence([lines, tok.pre_tokenizer])
    else:
        steps.append(normalizers.Replace("\n", sep))
    tok.normalizer = normalizers.Sequence(steps)
    if tok.decoder is None:
        tok.decoder = _word_decoder(eos)
    elif eos is not None:
        tok.decoder = decoders.Sequence([decoders.Replace(Regex(f"\\A{_escape(eos)}\\z"), "\n"), tok.decoder])
    return tok


def _start_id(encoder: LineEncoder) -> int | None:
    try:
        start = encoder.start_ids()
    except DataError:
        return None
    return start[0] if len(start) == 1 else None


def special_keys(encoder: LineEncoder, tok: Tokenizer) -> dict[str, str | None]:
    """``bos_token`` (the start symbol), ``eos_token`` (the end-of-line symbol, else the vocabulary's eos),
    ``unk_token`` and ``pad_token`` as the strings ``tok`` knows their ids by (``None`` where there is none)."""
    vocab = encoder.vocab
    ids = {"bos_token": _start_id(encoder), "eos_token": encoder.end_id if encoder.end_id is not None else
           vocab.eos_idx, "unk_token": vocab.unk_idx}
    out = {k: None if i is None else tok.id_to_token(i) for k, i in ids.items()}
    out["pad_token"] = tok.id_to_token(len(vocab))
    return out


def _pad_name(tok: Tokenizer) -> str:
    return next(n for n in (PAD_TOKEN, "<|pad|>", "<txl-pad>", "<txl-pad-0>") if tok.token_to_id(n) is None)


def _with_template(tok: Tokenizer, start: int | None) -> Tokenizer:
    """``tok`` whose post-processor puts the start symbol first (as ``txl score`` scores after it)."""
    a, b = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
    first: list[dict[str, Any]] = []
    special: dict[str, Any] = {}
    if start is not None:
        name = tok.id_to_token(start)
        first = [{"SpecialToken": {"id": name, "type_id": 0}}]
        special = {name: {"id": name, "ids": [start], "tokens": [name]}}
    spec = json.loads(tok.to_str())
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [*first, a], "pair": [*first, a, b],
                              "special_tokens": special}
    return Tokenizer.from_str(json.dumps(spec))


def build_tokenizer(encoder: LineEncoder) -> Tokenizer:
    """A ``tokenizers`` pipeline whose ``encode(text, add_special_tokens=False).ids`` is
    ``encoder.string_ids(text)`` for every ``str`` (see the module docstring); with special tokens the start symbol
    comes first. A new pad token (``<pad>``) takes the id ``len(encoder.vocab)``. Unknown symbols become the unknown
    id; without one in the vocabulary, encoding raises (``WordLevel error: Missing [UNK] token``), as the encoder
    raises :class:`DataError`."""
    n = len(encoder.vocab)
    if encoder.level == "subword":
        tok = _subword_tokenizer(encoder)
    else:
        keys, steps, pre, decoder = _level_parts(encoder)
        unk = encoder.vocab.unk_idx
        unk_key = next((k for k, i in keys.items() if i == unk), None) if unk is not None else None
        if unk_key is None:  # a key no text reaches, absent from the vocabulary: unknown symbols raise
            unk_key = next(k for k in ("<no unk>", "<no unk>'", "<no unk>''") if k not in keys)
        tok = Tokenizer(models.WordLevel(keys, unk_token=unk_key))
        tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizers.Sequence(steps), pre, decoder
    if tok.get_vocab_size(with_added_tokens=True) != n:
        raise ConfigError(f"the tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, the model's "
                          f"vocabulary {n}")
    tok.add_special_tokens([AddedToken(_pad_name(tok), special=True, normalized=False)])
    tok = _with_template(tok, _start_id(encoder))
    tok.encode_special_tokens = True
    return tok
