"""Scoring a text as it is read: ``txl score``'s records given while its input still arrives, in bounded memory.

:func:`score_stream` takes the lines of a text one at a time (a :class:`~transformer_xl.inference.reading.LineReader`,
or any iterable of lines) and gives the :class:`~transformer_xl.inference.score.ScoredText` records that
:func:`~transformer_xl.inference.score.score_text` gives the whole text, in the same order, holding one record
(and one batch of them) at a time:

* ``memory="carry"`` without ``documents`` (the whole text is one stream): :class:`StreamScorer` reads the stream
  segment by segment as its lines come, the very segments :func:`~transformer_xl.inference.score.score_ids` reads
  (the same scores, bit for bit); a line's record is given once the segment that holds its last token is read,
  at most ``tgt_len`` tokens later;
* otherwise (each line alone, or each document one stream) the records are scored ``batch_size`` streams at a
  time (:func:`~transformer_xl.inference.score.score_units`): when that many are read, at the end, and whenever
  ``waiting()`` says the next line has yet to arrive, so that the records of a pipe come as soon as they are
  complete. A text of more streams than a batch is batched otherwise than ``score_text`` batches it (which sorts
  them all by length): the same scores up to float rounding, as ``score_ids`` scores a batch.

A record (a line; with ``documents``, a document) of more than ``max_document_tokens`` tokens is a one-line
:class:`~transformer_xl.errors.DataError` as soon as its lines pass the limit, before the rest of it is read.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from transformer_xl.errors import ConfigError, DataError, check_int
from transformer_xl.inference.budget import check_scoring
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.score import MEMORY_MODES, ScoredText, score_segment, score_units
from transformer_xl.model import Recurrence, TransformerXLLM, eval_mode

__all__ = ["BYTES_PER_TOKEN", "DEFAULT_MAX_DOCUMENT_TOKENS", "StreamScorer", "score_stream"]

#: The most tokens a record (a line, or a document) may have unless told otherwise (``--max-document-tokens``).
DEFAULT_MAX_DOCUMENT_TOKENS = 1_000_000
#: A line may be this many bytes per token of the limit (``txl score`` refuses a longer one as it reads it).
BYTES_PER_TOKEN = 16


class StreamScorer:
    """One stream of ids scored as it grows (see the module docstring): :meth:`feed` appends ids and gives the
    log-probabilities of the targets of every full segment they complete; :meth:`finish` those of the last,
    shorter segment. ``start`` is the stream's first ids (the start symbol, which is not scored)."""

    def __init__(self, model: TransformerXLLM, start: list[int], *, tgt_len: int | None = None,
                 mem_len: int | None = None, clamp_len: int | None = None, same_length: bool | None = None) -> None:
        self.model = model
        self.tgt = check_int("tgt_len", model.config.tgt_len if tgt_len is None else tgt_len, 1)
        self.lengths = model.config.lengths(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length,
                                            ext_len=0)
        self.rec = Recurrence(model, self.lengths)
        self.device = next(model.parameters()).device
        self.window = list(start)  # the ids not yet read as inputs, and the last input's target
        self.pos = 0  # targets scored so far
        self.checked = 0  # the longest stream the machine's memory was checked for

    def feed(self, ids: Iterable[int]) -> np.ndarray:
        """Append ``ids``; the log-probabilities (float64) of the targets of the segments now complete."""
        self.window += ids
        done = []
        while len(self.window) > self.tgt:
            done.append(self._segment(self.tgt))
        return np.concatenate(done) if done else np.zeros(0)

    def finish(self) -> np.ndarray:
        """The log-probabilities of the targets left (the stream's last segment, shorter than ``tgt_len``)."""
        return self._segment(len(self.window) - 1) if len(self.window) > 1 else np.zeros(0)

    @torch.no_grad()
    def _segment(self, n: int) -> np.ndarray:
        # what the buffers take grows with the stream until the memory is full: checked until then
        positions = min(self.pos + n + 1, self.lengths.mem_len + self.tgt + 1)
        if positions > self.checked:
            check_scoring(self.model.config, rows=1, positions=positions, device=self.device, tgt_len=self.tgt,
                          mem_len=self.lengths.mem_len)
            self.checked = positions
        with eval_mode(self.model):
            log_probs, _ = score_segment(self.rec, [torch.tensor(self.window[:n + 1], dtype=torch.long)],
                                         device=self.device)
        del self.window[:n]
        self.pos += n
        return log_probs[0, :n]


def score_stream(model: TransformerXLLM, encoder: LineEncoder, lines: Iterable[str], *, documents: bool = False,
                 memory: str = "carry", batch_size: int = 16,
                 max_document_tokens: int = DEFAULT_MAX_DOCUMENT_TOKENS, waiting: Callable[[], bool] | None = None,
                 name: str = "the text", tgt_len: int | None = None, mem_len: int | None = None,
                 clamp_len: int | None = None, same_length: bool | None = None) -> Iterator[ScoredText]:
    """The records of ``lines`` as they are scored (see the module docstring); ``name`` names the input in errors.
    An input without anything but whitespace is a one-line :class:`DataError` when it ends."""
    if memory not in MEMORY_MODES:
        raise ConfigError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {memory!r}")
    check_int("batch_size", batch_size, 1)
    check_int("max_document_tokens", max_document_tokens, 1)
    lengths: dict[str, Any] = dict(tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    units = _units(encoder, lines, documents=documents, limit=max_document_tokens, name=name)
    if memory == "carry" and not documents:
        scorer = StreamScorer(model, encoder.start_ids(), **lengths)
        pending: collections.deque[ScoredText] = collections.deque()
        symbols = encoder.vocab.idx2sym
        for text, (ids,) in units:
            pending.append(ScoredText(text, [symbols[i] for i in ids], list(ids), char_level=encoder.char_level))
            yield from _settle(pending, scorer.feed(ids))
        yield from _settle(pending, scorer.finish())
        return
    texts: list[str] = []
    pieces: list[list[list[int]]] = []
    for text, ids in units:
        texts.append(text)
        pieces.append(ids)
        streams = sum(map(len, pieces)) if memory == "reset" else len(pieces)
        if streams >= batch_size or (waiting is not None and waiting()):
            yield from score_units(model, encoder, texts, pieces, memory=memory, batch_size=batch_size, **lengths)
            texts, pieces = [], []
    if texts:
        yield from score_units(model, encoder, texts, pieces, memory=memory, batch_size=batch_size, **lengths)


def _settle(pending: collections.deque[ScoredText], log_probs: np.ndarray) -> Iterator[ScoredText]:
    """Hand ``log_probs`` (the next targets of the stream) to the records waiting for them, in order; give those
    that are complete."""
    values, at = log_probs.tolist(), 0
    while pending:
        rec = pending[0]
        take = values[at:at + len(rec.token_ids) - len(rec.log_probs)]
        rec.log_probs += take
        at += len(take)
        if len(rec.log_probs) < len(rec.token_ids):
            return
        yield pending.popleft()


def _units(encoder: LineEncoder, lines: Iterable[str], *, documents: bool, limit: int,
           name: str) -> Iterator[tuple[str, list[list[int]]]]:
    """``(text, ids of each of its lines)`` of each line, or each document (runs of non-blank lines) with
    ``documents``; a one-line :class:`DataError` for a record of more than ``limit`` tokens, or an input of
    nothing but whitespace."""
    seen, held, pieces, count, first = False, [], [], 0, 0
    for number, line in enumerate(lines, 1):
        blank = not line.strip()
        seen = seen or not blank
        if documents and blank:
            if held:
                yield "\n".join(held), pieces
                held, pieces, count = [], [], 0
            continue
        ids = encoder.line_ids(line)
        count, first = count + len(ids), first if held else number
        if count > limit:
            what = f"line {number}" if first == number else f"the document of lines {first}-{number}"
            raise DataError(f"{name}: {what} has more than {limit:,} tokens; split it (blank lines end a document) "
                            "or raise the limit (--max-document-tokens)")
        if not documents:
            yield line, [ids]
            count = 0
            continue
        held.append(line)
        pieces.append(ids)
    if held:
        yield "\n".join(held), pieces
    if not seen:
        raise DataError(f"nothing to score: {name} is empty")
