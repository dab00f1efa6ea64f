"""Scoring text: the log-probability of every token of each line or document, read with the model's memory.

A text is a stream of ids: the start-of-line symbol (:meth:`~transformer_xl.inference.lines.LineEncoder.start_ids`,
``<eos>`` where the vocabulary has one), then each line's tokens with its end-of-line symbol
(:mod:`transformer_xl.inference.lines`). Every token after the start symbol is scored, and the stream is read as
``txl eval --batch-size 1`` reads a split: segments of ``tgt_len`` tokens, each attending to the memory of the
``mem_len`` positions before it (:class:`transformer_xl.model.Recurrence`). So the scores of a text are exactly
those ``txl eval`` gives the same text read as a split that starts with an empty line (whose ``<eos>`` is the
start symbol).

:func:`score_text` cuts a text into units, lines or blank-line-separated documents, and reads them with
``memory="carry"`` (one stream per document, the whole text without documents: each line sees the lines before)
or ``memory="reset"`` (one stream per line: each line alone); :func:`score_units` does the same for units whose lines
are already ids. :func:`score_ids` scores any streams of ids as a batch: streams of different lengths are padded
and masked, with results equal to scoring them one at a time (up to float rounding), one
:func:`score_segment` after another; the memory each batch takes is checked against the machine before it is
allocated (:func:`transformer_xl.inference.budget.check_scoring`). Reading a text as it arrives is
:mod:`transformer_xl.inference.streaming`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from transformer_xl.errors import ConfigError, DataError, check_int
from transformer_xl.inference.budget import check_scoring
from transformer_xl.inference.lines import LineEncoder, split_lines
from transformer_xl.model import Recurrence, TransformerXLLM, eval_mode

__all__ = ["MEMORY_MODES", "ScoredText", "TokenScores", "score_ids", "score_segment", "score_text", "score_units",
           "split_documents"]

#: ``carry``: lines of a document read with the memory of the lines before; ``reset``: each line alone.
MEMORY_MODES = ("carry", "reset")


@dataclass
class TokenScores:
    """The scores of the tokens of one stream after its first: ``log_probs[i]`` (natural log) of token ``i + 1``
    given those before it, and, when asked, whether it was the model's most likely token there."""

    log_probs: np.ndarray
    is_greedy: np.ndarray | None = None


@dataclass
class ScoredText:
    """One line or document: its tokens (the vocabulary's symbols) and the log-probability of each."""

    text: str
    tokens: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    char_level: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.log_probs)

    @property
    def total_log_prob(self) -> float:
        """The log-probability of the whole unit (nats): the sum over its tokens."""
        return float(math.fsum(self.log_probs))

    @property
    def surprisal_bits(self) -> list[float]:
        """``-log2 p`` of each token."""
        return [-lp / math.log(2) for lp in self.log_probs]

    @property
    def ppl(self) -> float | None:
        """``exp`` of the mean negative log-probability per token (None without tokens)."""
        return math.exp(min(-self.total_log_prob / self.n_tokens, 700.0)) if self.n_tokens else None

    @property
    def bpc(self) -> float | None:
        """Bits per token (per character or byte), for character and byte models (None without tokens)."""
        return -self.total_log_prob / self.n_tokens / math.log(2) if self.n_tokens else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of ``txl score`` (``bpc`` for character and byte models, else ``ppl``)."""
        metric = {"bpc": self.bpc} if self.char_level else {"ppl": self.ppl}
        return {"text": self.text, "tokens": self.tokens, "log_probs": self.log_probs,
                "surprisal_bits": self.surprisal_bits, "n_tokens": self.n_tokens,
                "total_log_prob": self.total_log_prob, **metric}


def split_documents(text: str) -> list[str]:
    """The documents of ``text``: runs of non-blank lines, separated by one or more blank (or whitespace) lines."""
    docs: list[list[str]] = [[]]
    for line in split_lines(text):
        if line.strip():
            docs[-1].append(line)
        elif docs[-1]:
            docs.append([])
    return ["\n".join(d) for d in docs if d]


def score_text(model: TransformerXLLM, encoder: LineEncoder, text: str, *, documents: bool = False,
               memory: str = "carry", **kwargs: Any) -> list[ScoredText]:
    """Score each line of ``text`` (each blank-line-separated document with ``documents``), see the module
    docstring. ``kwargs`` go to :func:`score_ids` (``batch_size``, ``tgt_len``, ``mem_len``, ``clamp_len``,
    ``same_length``, ``progress``). A text without anything but whitespace is a one-line :class:`DataError`."""
    if memory not in MEMORY_MODES:
        raise ConfigError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {memory!r}")
    if not text.strip():
        raise DataError("nothing to score: the text is empty")
    units = split_documents(text) if documents else split_lines(text)
    pieces = [[encoder.line_ids(line) for line in split_lines(u)] or [encoder.line_ids("")] for u in units]
    return score_units(model, encoder, units, pieces, memory=memory, one_stream=not documents, **kwargs)


def score_units(model: TransformerXLLM, encoder: LineEncoder, units: Sequence[str], pieces: Sequence[list[list[int]]],
                *, memory: str = "carry", one_stream: bool = False, **kwargs: Any) -> list[ScoredText]:
    """The :class:`ScoredText` of each unit of text (a line or a document), given the ids of each of its lines
    (``pieces[u]``, :meth:`LineEncoder.line_ids`). Each line is a stream of its own with ``memory="reset"``;
    with ``"carry"`` each unit is one stream, or all units are one with ``one_stream``. ``kwargs`` go to
    :func:`score_ids`."""
    # a stream: the start symbol, then pieces (unit, ids) read in order
    if memory == "reset":
        plan = [[(u, ids)] for u, lines in enumerate(pieces) for ids in lines]
    elif not one_stream:
        plan = [[(u, ids) for ids in lines] for u, lines in enumerate(pieces)]
    else:
        plan = [[(u, ids) for u, lines in enumerate(pieces) for ids in lines]]
    start = encoder.start_ids()
    streams = [start + [i for _, ids in stream for i in ids] for stream in plan]
    scores = score_ids(model, streams, **kwargs)
    out = [ScoredText(u, char_level=encoder.char_level) for u in units]
    symbols = encoder.vocab.idx2sym
    for stream, sc in zip(plan, scores):
        pos = 0
        for u, ids in stream:
            out[u].token_ids += ids
            out[u].tokens += [symbols[i] for i in ids]
            out[u].log_probs += sc.log_probs[pos:pos + len(ids)].tolist()
            pos += len(ids)
    return out


@torch.no_grad()
def score_ids(model: TransformerXLLM, streams: Sequence[Sequence[int]], *, batch_size: int = 16,
              tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
              same_length: bool | None = None, greedy: bool = False, progress: str = "off",
              desc: str = "score") -> list[TokenScores]:
    """Score every token but the first of each stream of ids, reading it in segments of ``tgt_len`` with the memory
    of the ``mem_len`` positions before (lengths left ``None`` keep the model's; no extended context).

    Streams are scored ``batch_size`` at a time (the longest first, padded and masked); the results are those of
    each stream scored alone. ``greedy`` also tells whether each token was the model's most likely one (computes the
    full distribution: slower). ``progress`` is a :mod:`transformer_xl.data.progress` mode over the tokens.
    """
    from transformer_xl.data.progress import Progress

    check_int("batch_size", batch_size, 1)
    tgt = check_int("tgt_len", model.config.tgt_len if tgt_len is None else tgt_len, 1)
    lengths = model.config.lengths(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length, ext_len=0)
    n_token = model.config.n_token
    rows = [torch.as_tensor(list(s), dtype=torch.long) for s in streams]
    for r in rows:
        if r.numel() and (int(r.min()) < 0 or int(r.max()) >= n_token):
            raise DataError(f"token ids must lie in [0, {n_token}), got {int(r.min())}..{int(r.max())}")
    results: list[TokenScores] = [TokenScores(np.zeros(0), np.zeros(0, dtype=bool) if greedy else None)
                                  for _ in rows]
    order = sorted((i for i in range(len(rows)) if rows[i].numel() > 1), key=lambda i: -rows[i].numel())
    device = next(model.parameters()).device
    bar = Progress(sum(max(r.numel() - 1, 0) for r in rows), desc=desc, unit="tok", mode=progress,
                   min_seconds=2.0)
    with eval_mode(model):
        for b in range(0, len(order), batch_size):
            chunk = order[b:b + batch_size]
            # the longest stream first: what this batch's buffers take, refused before they are allocated
            check_scoring(model.config, rows=len(chunk), positions=rows[chunk[0]].numel(), device=device,
                          tgt_len=tgt, mem_len=lengths.mem_len, full_distribution=greedy)
            for i, sc in zip(chunk, _score_batch(model, [rows[i] for i in chunk], tgt, lengths, greedy, device,
                                                 bar)):
                results[i] = sc
    bar.close()
    return results


def _score_batch(model: TransformerXLLM, rows: list[torch.Tensor], tgt: int, lengths: Any, greedy: bool,
                 device: torch.device, bar: Any) -> list[TokenScores]:
    """Streams read side by side, segment by segment; a stream that ends leaves the batch (and its memory)."""
    n_targets = [r.numel() - 1 for r in rows]
    log_probs = [np.zeros(n) for n in n_targets]
    hits = [np.zeros(n, dtype=bool) for n in n_targets]
    active = list(range(len(rows)))
    rec = Recurrence(model, lengths)
    pos = 0
    while active:
        seg = [min(tgt, n_targets[r] - pos) for r in active]
        lp, best = score_segment(rec, [rows[r][pos:pos + n + 1] for r, n in zip(active, seg)], greedy=greedy,
                                 device=device)
        for k, (r, n) in enumerate(zip(active, seg)):
            log_probs[r][pos:pos + n] = lp[k, :n]
            if best is not None:
                hits[r][pos:pos + n] = best[k, :n]
        bar.update(sum(seg))
        keep = [r for r in active if n_targets[r] > pos + tgt]
        if keep and keep != active:
            rec = Recurrence(model, lengths, mems=_rows_of(rec.mems, active, keep))
        active, pos = keep, pos + tgt
    return [TokenScores(lp, h if greedy else None) for lp, h in zip(log_probs, hits)]


def score_segment(rec: Recurrence, pieces: Sequence[torch.Tensor], *, greedy: bool = False,
                  device: torch.device | str = "cpu") -> tuple[np.ndarray, np.ndarray | None]:
    """The next segment of the streams that ``rec`` reads side by side: ``pieces[k]`` holds stream ``k``'s next
    ``n_k`` inputs and the token after them (``n_k + 1`` ids). The log-probability ``[B, max n]`` (float64) of
    each next token, and with ``greedy`` whether it was the most likely one; positions past a row's ``n_k`` are
    padding.

    A shorter row is padded after its end to the longest one: a query never attends to a later key, and with
    ``same_length`` the keys a real query loses to the window do not depend on the padded length either."""
    seg = [p.numel() - 1 for p in pieces]
    x = torch.zeros(len(pieces), max(seg), dtype=torch.long)  # [B, Q], padded after each row's end
    y = torch.zeros_like(x)
    for k, (p, n) in enumerate(zip(pieces, seg)):
        x[k, :n] = p[:n]
        y[k, :n] = p[1:n + 1]
    # left out: where the batch goes (the model's device) only shows on a GPU
    out = rec(x.to(device), y.to(device), return_log_probs=greedy)  # pragma: no mutate
    log_probs = -out.nll.double().cpu().numpy()  # [B, Q]
    best = (out.log_probs.argmax(-1).cpu() == y).numpy() if greedy else None  # [B, Q]
    return log_probs, best


def _rows_of(mems: list[torch.Tensor], rows: list[int], subset: list[int]) -> list[torch.Tensor]:
    """The memories (``[B, M, D]`` each, one row per stream of ``rows``) of the streams ``subset``."""
    if not mems:
        return []
    # left out: the device of the index (mems[0]'s, that of every layer's memory) only shows on a GPU
    idx = torch.tensor([rows.index(r) for r in subset], device=mems[0].device)  # pragma: no mutate
    return [m.index_select(0, idx) for m in mems]
