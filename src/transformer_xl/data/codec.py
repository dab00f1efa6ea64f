"""Text <-> ids: prompt encoding and streaming detokenization per vocabulary level (used by generation).

The level is read from the vocabulary's symbols (``detect_level``) or given:

* ``word`` (PTB, WikiText, lm1b, user word corpora): whitespace tokens, ``<eos>`` ends a line. Output joins
  tokens with spaces and undoes the WikiText/Moses conventions a reader notices: ``@-@``, ``@,@``, ``@.@``
  join their neighbours, no space before ``, . ; : ! ? ) ]`` and clitics (``'s``, ``n't``), none after
  ``( [``; ``<eos>`` becomes a newline. Prompts get the inverse treatment when the vocabulary has ``@-@``.
* ``char`` (``*-char`` corpora): one symbol per character, ``<eos>`` (or ``\\n``) is a newline.
* ``text8``: ``a``–``z`` and ``_`` for a space.
* ``byte`` (enwik8, user byte corpora): symbols are byte values ``"0"``–``"255"``; output is decoded as
  UTF-8 incrementally, invalid or incomplete sequences become U+FFFD.

Fallbacks (documented, never a crash): unknown words become ``<unk>`` with a warning (dropped, with a
warning, when the vocabulary has no ``<unk>``); characters or bytes a char/byte vocabulary lacks become
``<unk>`` or are dropped, with a warning; an empty prompt starts from ``<eos>`` (the start of a line), or
from a newline/space symbol when there is no ``<eos>``.
"""

from __future__ import annotations

import codecs
import re
import string
import warnings
from collections.abc import Iterable

from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import ConfigError, DataError

LEVELS = ("word", "char", "text8", "byte")

_WT_JOINERS = {"@-@": "-", "@,@": ",", "@.@": "."}
_NO_SPACE_BEFORE = {",", ".", ";", ":", "!", "?", ")", "]", "}", "%", "...", "'s", "'t", "'re", "'ve", "'ll", "'d",
                    "'m", "n't", "'", "'S", "N'T"}
_NO_SPACE_AFTER = {"(", "[", "{", "$", "#"}


class PromptWarning(UserWarning):
    """The prompt had symbols the vocabulary lacks (mapped to ``<unk>`` or dropped)."""


def _is_byte(symbol: str) -> bool:
    """Whether ``symbol`` names a byte value: ``"0"`` to ``"255"`` in ASCII digits (not ``"²"``, which
    ``str.isdigit`` accepts)."""
    return symbol.isascii() and symbol.isdigit() and int(symbol) < 256


def detect_level(vocab: Vocab) -> str:
    """``word``, ``char``, ``text8`` or ``byte`` from the symbols of ``vocab`` (special symbols ignored)."""
    special = set(vocab.special) | {vocab.eos, vocab.unk}
    plain = [s for s in vocab.idx2sym if s not in special]
    if not plain:
        return "word"
    if len(vocab) <= 256 and all(_is_byte(s) for s in plain):
        return "byte"
    if "_" in plain and set(plain) <= set(string.ascii_lowercase + "_"):
        return "text8"
    if all(len(s) == 1 for s in plain):
        return "char"
    return "word"


def _wikitext_split(line: str) -> list[str]:
    """Light WikiText tokenization of user text: ``well-known`` -> ``well @-@ known``, ``1,000`` ->
    ``1 @,@ 000``, ``3.5`` -> ``3 @.@ 5``, punctuation and clitics split off words; text already in that form
    (``1 @,@ 000``, ``do n't``) is left as it is."""
    line = re.sub(r"@([-,.])@", lambda m: {"-": "\0H", ",": "\0C", ".": "\0D"}[m.group(1)], line)  # already split
    line = re.sub(r"(?<=\d),(?=\d)", "\0C", line)  # placeholders survive the punctuation split below
    line = re.sub(r"(?<=\d)\.(?=\d)", "\0D", line)
    line = re.sub(r"(?<=\w)-(?=\w)", "\0H", line)
    line = re.sub(r"([,;:!?()\[\]\"])", r" \1 ", line)
    line = re.sub(r"(\w)(n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1 \2", line)  # PTB style; WikiText has "didn 't"
    line = re.sub(r"(?<=\w)\.(\s|$)", r" .\1", line)
    line = line.replace("\0C", " @,@ ").replace("\0D", " @.@ ").replace("\0H", " @-@ ")
    return line.split()


class TextCodec:
    """Encode prompts and decode generated ids for one vocabulary (see the module docstring)."""

    def __init__(self, vocab: Vocab, level: str | None = None) -> None:
        self.vocab = vocab
        self.level = level or detect_level(vocab)
        if self.level not in LEVELS:
            raise ConfigError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        detected = detect_level(vocab)  # bytes over words, or characters over bytes, would only make <unk>s
        if (self.level, detected) == ("byte", "word") or (detected == "byte" and self.level != "byte"):
            raise ConfigError(f"level {self.level!r} does not fit this vocabulary of {detected}-level symbols")
        symbols = vocab.idx2sym
        self.wikitext = "@-@" in vocab
        special = set(vocab.special) | {vocab.eos, vocab.unk}
        self.lower = self.level == "text8" or not any(s != s.lower() for s in symbols if s not in special)
        self._newline = vocab.eos if vocab.eos is not None else ("\n" if "\n" in vocab else None)
        if self.level == "byte":
            self._byte_of = {i: int(s) for i, s in enumerate(symbols) if _is_byte(s)}

    # -- prompt -> ids ----------------------------------------------------------------------------
    def start_ids(self) -> list[int]:
        """What an empty prompt starts from: ``<eos>`` (a line start), else a newline or space symbol."""
        v = self.vocab
        for sym in (v.eos, "\n", "10", " ", "_", "32"):
            if sym is not None and sym in v and (self.level == "byte") == _is_byte(sym):
                return [v.sym2idx[sym]]
        if v.eos is not None:
            return [v.eos_idx]  # type: ignore[list-item]
        raise DataError("the prompt is empty and the vocabulary has no <eos>, newline or space to start from; "
                        "give a prompt")

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; symbols the vocabulary lacks are mapped/dropped with a :class:`PromptWarning`."""
        if not text:
            return self.start_ids()
        if self.level == "byte":
            return self._lookup([str(b) for b in text.encode("utf-8")], "bytes")
        if self.lower:
            text = text.lower()
        lines = text.split("\n")
        syms: list[str] = []
        for i, line in enumerate(lines):
            if self.level == "word":
                syms.extend(_wikitext_split(line) if self.wikitext else line.split())
            elif self.level == "text8":
                syms.extend("_" if c.isspace() else c for c in line)
            else:
                syms.extend(line)
            if i < len(lines) - 1:
                if self._newline is not None:
                    syms.append(self._newline)
                elif self.level == "text8":
                    syms.append("_")
        ids = self._lookup(syms, "words" if self.level == "word" else "characters")
        return ids or self.start_ids()

    def _lookup(self, syms: list[str], what: str) -> list[int]:
        v = self.vocab
        missing = sorted({s for s in syms if s not in v})
        if missing:
            shown = ", ".join(repr(s) for s in missing[:8]) + (" ..." if len(missing) > 8 else "")
            fate = f"mapped to {v.unk}" if v.unk is not None else "dropped (the vocabulary has no unknown symbol)"
            warnings.warn(f"{len(missing)} {what} of the prompt are not in the vocabulary, {fate}: {shown}",
                          PromptWarning, stacklevel=3)
        if v.unk is None:
            syms = [s for s in syms if s in v]
        return [int(i) for i in v.encode(syms)]

    # -- ids -> text ------------------------------------------------------------------------------
    def decoder(self, context: Iterable[int] = ()) -> StreamDecoder:
        """A fresh incremental decoder (one per sample) that has seen ``context`` (e.g. the prompt ids),
        so that the first new word gets its space."""
        dec = StreamDecoder(self)
        dec.feed(context)
        return dec

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (what a :class:`StreamDecoder` prints, all at once)."""
        dec = self.decoder()
        return dec.feed(ids) + dec.flush()


class StreamDecoder:
    """Turns ids into text piece by piece: ``feed(ids) -> str`` as they come, ``flush()`` at the end."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self._prev: str | None = None  # previous word symbol (None at a line start)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        c = self.codec
        ids = [int(i) for i in ids]
        syms = c.vocab.decode(ids)  # also checks the range
        if c.level == "byte":  # special symbols of a byte vocabulary (none in enwik8) print nothing
            return self._utf8.decode(bytes(c._byte_of[i] for i in ids if i in c._byte_of))
        if c.level == "word":
            return "".join(self._word(s) for s in syms)
        out = []
        for s in syms:
            if s == c._newline:
                out.append("\n")
            elif s == c.vocab.unk:
                out.append("\ufffd")
            elif c.level == "text8" and s == "_":
                out.append(" ")
            else:
                out.append(s)
        return "".join(out)

    def _word(self, sym: str) -> str:
        c, prev = self.codec, self._prev
        if sym == c.vocab.eos:
            self._prev = None
            return "\n"
        self._prev = sym
        text = _WT_JOINERS.get(sym, sym) if c.wikitext else sym
        if prev is None:
            return text
        glue = (sym in _NO_SPACE_BEFORE or prev in _NO_SPACE_AFTER
                or (c.wikitext and (sym in _WT_JOINERS or prev in _WT_JOINERS)))
        return text if glue else " " + text

    def flush(self) -> str:
        """What an incomplete UTF-8 sequence at the end becomes (U+FFFD), else ``""``."""
        return self._utf8.decode(b"", final=True) if self.codec.level == "byte" else ""
