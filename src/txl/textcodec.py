"""Text <-> ids for generation: prompt encoding and streaming detokenization per vocabulary level.

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txl.data.vocab import Vocab
from txl.errors import CheckpointError, ConfigError, DataError
from txl.generate import stream
from txl.model import TransformerXLLM

LEVELS = ("word", "char", "text8", "byte")

_WT_JOINERS = {"@-@": "-", "@,@": ",", "@.@": "."}
_NO_SPACE_BEFORE = {",", ".", ";", ":", "!", "?", ")", "]", "}", "%", "...", "'s", "'t", "'re", "'ve", "'ll", "'d",
                    "'m", "n't", "'", "'S", "N'T"}
_NO_SPACE_AFTER = {"(", "[", "{", "$", "#"}


class PromptWarning(UserWarning):
    """The prompt had symbols the vocabulary lacks (mapped to ``<unk>`` or dropped)."""


def detect_level(vocab: Vocab) -> str:
    """``word``, ``char``, ``text8`` or ``byte`` from the symbols of ``vocab`` (special symbols ignored)."""
    special = set(vocab.special) | {vocab.eos, vocab.unk}
    plain = [s for s in vocab.idx2sym if s not in special]
    if not plain:
        return "word"
    if len(vocab) <= 256 and all(s.isdigit() and int(s) < 256 for s in plain):
        return "byte"
    if "_" in plain and set(plain) <= set(string.ascii_lowercase + "_"):
        return "text8"
    if all(len(s) == 1 for s in plain):
        return "char"
    return "word"


def _wikitext_split(line: str) -> list[str]:
    """Light WikiText tokenization of user text: ``well-known`` -> ``well @-@ known``, ``1,000`` ->
    ``1 @,@ 000``, ``3.5`` -> ``3 @.@ 5``, punctuation and clitics split off words."""
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
        symbols = vocab.idx2sym
        self.wikitext = "@-@" in vocab
        special = set(vocab.special) | {vocab.eos, vocab.unk}
        self.lower = self.level == "text8" or not any(s != s.lower() for s in symbols if s not in special)
        self._newline = vocab.eos if vocab.eos is not None else ("\n" if "\n" in vocab else None)
        if self.level == "byte":
            self._byte_of = {i: int(s) for i, s in enumerate(symbols) if s.isdigit() and int(s) < 256}

    # -- prompt -> ids ----------------------------------------------------------------------------
    def start_ids(self) -> list[int]:
        """What an empty prompt starts from: ``<eos>`` (a line start), else a newline or space symbol."""
        v = self.vocab
        for sym in (v.eos, "\n", "10", " ", "_", "32"):
            if sym is not None and sym in v and (self.level == "byte") == sym.isdigit():
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


# ---------------------------------------------------------------------------------------------- model dirs
VOCAB_NAME = "vocab.json"


def find_vocab(model_dir: str | Path, vocab: str | Path | None = None) -> Vocab:
    """The vocabulary of a model: ``vocab`` if given, else ``MODEL_DIR/vocab.json``, else the parent
    directory's ``vocab.json`` (a training run's ``best/`` and ``final/`` share their run's)."""
    if vocab is not None:
        return Vocab.load(vocab)
    model_dir = Path(model_dir)
    for cand in (model_dir / VOCAB_NAME, model_dir.parent / VOCAB_NAME):
        if cand.is_file():
            return Vocab.load(cand)
    raise CheckpointError(f"no vocabulary for {model_dir}: neither {model_dir / VOCAB_NAME} nor "
                          f"{model_dir.parent / VOCAB_NAME} exists; pass --vocab PATH (a txl vocab JSON)")


@dataclass
class TextPiece:
    """Text of one sample that became final at one step (what ``--stream`` prints)."""

    sample: int
    step: int
    token_id: int
    log_prob: float
    text: str


@dataclass
class TextSample:
    """One finished sample."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # length | stop_token | stop_string


def stream_text(model: TransformerXLLM, codec: TextCodec, prompt: str, *, num_samples: int = 1,
                stop_strings: Sequence[str] = (), stop_tokens: Sequence[str] = (),
                results: list[TextSample] | None = None, **kwargs: Any) -> Iterator[TextPiece]:
    """Generate ``num_samples`` continuations of ``prompt`` as a batch, yielding text as it becomes final.

    ``kwargs`` go to :func:`txl.generate.stream`. A sample ends at a stop token (kept in its text) or a stop
    string (cut off, not printed); text that could begin a stop string is held back until it cannot.
    ``results`` (if given) receives one :class:`TextSample` per sample when the iterator ends.
    """
    _check_samples(num_samples)
    if any(not s for s in stop_strings):
        raise ConfigError("stop strings must not be empty")
    unknown = [s for s in stop_tokens if s not in codec.vocab]
    if unknown:
        raise ConfigError(f"stop token {unknown[0]!r} is not a symbol of the vocabulary")
    prompt_ids = codec.encode(prompt)
    stop_ids = [codec.vocab.sym2idx[s] for s in stop_tokens]
    samples = [TextSample() for _ in range(num_samples)] if results is None else results
    samples[:] = [TextSample() for _ in range(num_samples)]
    decoders = [codec.decoder(prompt_ids) for _ in range(num_samples)]
    text = [""] * num_samples
    shown = [0] * num_samples
    done = [False] * num_samples
    steps = stream(model, [prompt_ids] * num_samples, stop_token_ids=stop_ids, **kwargs)
    try:
        for step in steps:
            toks, lps = step.tokens.tolist(), step.log_probs.tolist()
            for b in range(num_samples):
                if done[b]:
                    continue
                s = samples[b]
                s.token_ids.append(toks[b])
                s.log_probs.append(lps[b])
                text[b] += decoders[b].feed([toks[b]])
                end, hold = _stop_scan(text[b], stop_strings)
                if end is not None:
                    done[b], s.finish_reason, text[b] = True, "stop_string", text[b][:end]
                elif bool(step.finished[b]):
                    done[b], s.finish_reason = True, "stop_token"
                if done[b]:
                    text[b] += decoders[b].flush()
                    hold = 0
                piece = text[b][shown[b]:len(text[b]) - hold]
                shown[b] += len(piece)
                yield TextPiece(b, step.index, toks[b], lps[b], piece)
            if all(done):
                break
        for b in range(num_samples):
            if not done[b]:
                text[b] += decoders[b].flush()
                rest = text[b][shown[b]:]
                if rest:
                    yield TextPiece(b, -1, -1, 0.0, rest)
            samples[b].text = text[b]
    finally:
        steps.close()


def _check_samples(n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"num_samples must be an integer >= 1, got {n!r}")


def _stop_scan(text: str, stops: Sequence[str]) -> tuple[int | None, int]:
    """(index where the first stop string starts, or None; length of the tail that may begin one)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return min(hits), 0
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return None, hold
