"""Text -> ids for scoring: each line as the corpus preparation turned it into tokens (what the model saw).

Scoring (:mod:`transformer_xl.inference.score`) must give a text the ids that ``txl eval`` gives the same text
read as a dataset split, so a line becomes ids by the rules of the corpus builders
(:mod:`transformer_xl.data.builders`), per vocabulary level:

* ``word``: ``line.split()`` (whitespace words, lower-cased when the vocabulary has no upper-case symbol) and
  ``<eos>`` after the line;
* ``char``: the characters of ``line.strip()`` (spaces inside the line are symbols), then ``<eos>`` (or the
  newline symbol);
* ``text8``: the characters of ``line.strip()``, a space as ``_``, no line end (text8 is one line);
* ``byte``: the line's UTF-8 bytes, then the newline byte ``10`` when the vocabulary has it (enwik8 has not);
* ``subword`` (a model trained with ``--tokenizer tok.json``): the tokenizer's ids of ``line.strip()``, then
  ``<eos>``.

A symbol the vocabulary lacks becomes ``<unk>`` (counted in :attr:`LineEncoder.unknown`); without an unknown
symbol in the vocabulary it is a one-line :class:`transformer_xl.errors.DataError`, as preparing a corpus refuses it.
The text starts from :meth:`LineEncoder.start_ids`: the start-of-line symbol (``<eos>``, else a newline or space
symbol), which precedes every line of the training text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformer_xl.data import Vocab
from transformer_xl.data.codec import TextCodec
from transformer_xl.errors import DataError

__all__ = ["CHAR_LEVELS", "LineEncoder"]

#: Levels whose tokens are characters or bytes: their metric is bits per character, not perplexity.
CHAR_LEVELS = ("char", "byte", "text8")


class LineEncoder:
    """Lines of text -> token ids of one vocabulary (see the module docstring).

    ``level`` (``word``, ``char``, ``text8``, ``byte``) defaults to the one the vocabulary's symbols show;
    ``tokenizer`` (a ``tokenizers`` JSON) makes it a subword model's encoder.
    """

    def __init__(self, vocab: Vocab, *, level: str | None = None, tokenizer: str | Path | None = None) -> None:
        self.vocab = vocab
        self.tokenizer: Any = None
        codec = TextCodec(vocab, level if tokenizer is None else None)
        #: What turns generated ids back into text (:class:`TextCodec`, or a subword model's ``SubwordCodec``).
        self.codec: Any = codec
        if tokenizer is not None:
            from transformer_xl.data.subword import SubwordCodec

            self.codec = SubwordCodec(vocab, tokenizer)
            self.tokenizer = self.codec.tok
            self.level = "subword"
        else:
            self.level = codec.level
        self.lower = codec.lower and self.level not in ("subword", "byte")  # bytes are never lower-cased
        self._start = codec.start_ids() if self.tokenizer is None else None
        end = vocab.eos
        if self.level == "char" and end is None:
            end = "\n" if "\n" in vocab else None
        elif self.level == "byte":
            end = "10" if "10" in vocab else None
        elif self.level == "text8":
            end = None
        self.end_id = vocab.sym2idx[end] if end is not None else None
        self.unknown = 0

    @classmethod
    def for_model(cls, model_dir: str | Path, *, vocab: str | Path | None = None, level: str | None = None,
                  tokenizer: str | Path | None = None) -> LineEncoder:
        """The encoder of the model in ``model_dir``: its vocabulary (``vocab``, else the one beside it or its
        run's) and, unless ``level`` or ``tokenizer`` is given, the level or tokenizer its run was trained with."""
        from transformer_xl.inference.loading import load_vocab, run_text_options

        if level is None and tokenizer is None:
            options = run_text_options(Path(model_dir))
            level, tokenizer = options.get("level"), options.get("tokenizer")
        return cls(load_vocab(model_dir, vocab), level=level, tokenizer=tokenizer)

    @property
    def char_level(self) -> bool:
        """Whether a token is a character or a byte (bits per character are reported, not perplexity)."""
        return self.level in CHAR_LEVELS

    def start_ids(self) -> list[int]:
        """What every text starts from: the start-of-line symbol the training text had before each line."""
        if self._start is None:
            if self.vocab.eos_idx is None:
                raise DataError("the vocabulary has no <eos> to start a text from")
            return [self.vocab.eos_idx]
        return list(self._start)

    def line_ids(self, line: str) -> list[int]:
        """The ids of one line of text (no newline inside), its end-of-line symbol included."""
        if self.lower:
            line = line.lower()
        if self.tokenizer is not None:
            ids = list(self.tokenizer.encode(line.strip(), add_special_tokens=False).ids)
        else:
            ids = self._lookup(self._symbols(line))
        return ids + ([self.end_id] if self.end_id is not None else [])

    def text_ids(self, text: str) -> list[int]:
        """The ids of ``text`` read as lines (a final newline ends the last line, it does not start another)."""
        return [i for line in split_lines(text) for i in self.line_ids(line)]

    def string_ids(self, text: str) -> list[int]:
        """The ids of a piece of text that need not end its line (a prompt, or a continuation of one): lines end
        with their end-of-line symbol only where ``text`` has a newline (``"a b"`` gets none, ``"a b\\n"`` one)."""
        *lines, last = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        ids = [i for line in lines for i in self.line_ids(line)]
        tail = self.line_ids(last)
        return ids + (tail[:-1] if self.end_id is not None else tail)

    def _symbols(self, line: str) -> list[str]:
        if self.level == "word":
            return line.split()
        if self.level == "byte":
            return [str(b) for b in line.encode("utf-8")]
        stripped = line.strip()
        return ["_" if c.isspace() else c for c in stripped] if self.level == "text8" else list(stripped)

    def _lookup(self, symbols: list[str]) -> list[int]:
        index, unk = self.vocab.sym2idx, self.vocab.unk_idx
        ids = []
        for s in symbols:
            i = index.get(s)
            if i is None:
                if unk is None:
                    raise DataError(f"symbol {s!r} is not in the model's vocabulary, which has no unknown symbol")
                i, self.unknown = unk, self.unknown + 1
            ids.append(i)
        return ids


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` as a file holds them: ``\\r\\n`` and ``\\r`` end lines too, and a final newline ends
    the last line (``"a\\nb\\n"`` has two lines, ``""`` none)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines
