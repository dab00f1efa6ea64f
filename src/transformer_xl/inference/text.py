"""Text generation: prompts in, text out as it becomes final (``txl generate``).

:func:`stream_text` encodes a prompt with a :class:`transformer_xl.data.codec.TextCodec`, generates a batch of samples
with :func:`transformer_xl.inference.generate.stream`, and yields each sample's text as soon as no later token can
change
it: stop strings are cut off (text that could begin one is held back until it cannot), stop tokens end a
sample, and incomplete UTF-8 sequences of byte-level models wait for their last byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer_xl.data.codec import TextCodec
from transformer_xl.errors import ConfigError
from transformer_xl.inference.generate import LM, stream


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


def stream_text(model: LM, codec: TextCodec, prompt: str, *, num_samples: int = 1,
                stop_strings: Sequence[str] = (), stop_tokens: Sequence[str] = (),
                results: list[TextSample] | None = None, **kwargs: Any) -> Iterator[TextPiece]:
    """Generate ``num_samples`` continuations of ``prompt`` as a batch, yielding text as it becomes final.

    ``kwargs`` go to :func:`transformer_xl.inference.generate.stream`. A sample ends at a stop token (kept in its
    text) or a stop
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
    texts = [SampleText(codec, prompt_ids, stop_strings) for _ in range(num_samples)]
    steps = stream(model, [prompt_ids] * num_samples, stop_token_ids=stop_ids, **kwargs)
    try:
        for step in steps:
            toks, lps = step.tokens.tolist(), step.log_probs.tolist()
            for b, t in enumerate(texts):
                if t.done:
                    continue
                samples[b].token_ids.append(toks[b])
                samples[b].log_probs.append(lps[b])
                yield TextPiece(b, step.index, toks[b], lps[b], t.feed(toks[b], stop_token=bool(step.finished[b])))
            if all(t.done for t in texts):
                break
        for b, t in enumerate(texts):
            rest = t.close()
            if rest:
                yield TextPiece(b, -1, -1, 0.0, rest)
            samples[b].text, samples[b].finish_reason = t.text, t.finish_reason
    finally:
        steps.close()


class SampleText:
    """The text of one sample as its tokens arrive (what :func:`stream_text` does for each sample): detokenized
    after ``context`` (the prompt ids), cut at the first stop string, text that could begin one held back."""

    def __init__(self, codec: TextCodec, context: Sequence[int] = (), stop_strings: Sequence[str] = ()) -> None:
        self.stop_strings = list(stop_strings)
        self.stops = StopMatcher(self.stop_strings)
        self.decoder = codec.decoder(context)
        self.text = ""  # the sample's text so far (stop string cut off)
        self.shown = 0  # how much of it :meth:`feed` has returned
        self.done = False
        self.finish_reason = "length"  # length | stop_token | stop_string

    def feed(self, token_id: int, *, stop_token: bool = False) -> str:
        """Add one token (``stop_token``: it ends the sample); the text that became final."""
        new = self.decoder.feed([token_id])
        self.text += new
        end, hold = self.stops.feed(new), self.stops.hold
        if end is not None:
            self.done, self.finish_reason, self.text = True, "stop_string", self.text[:end]
        elif stop_token:
            self.done, self.finish_reason = True, "stop_token"
        if self.done:
            self.text += self.decoder.flush()
            hold = 0
        piece = self.text[self.shown:len(self.text) - hold]
        self.shown += len(piece)
        return piece

    def close(self) -> str:
        """End the sample (if no stop ended it): the text still held back."""
        if not self.done:
            self.done = True
            self.text += self.decoder.flush()
        rest = self.text[self.shown:]
        self.shown = len(self.text)
        return rest


def _check_samples(n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"num_samples must be an integer >= 1, got {n!r}")


class StopMatcher:
    """Where the first of some stop strings begins in a text that arrives piece by piece, and how long the end of the
    text is that may begin one (the text to hold back).

    Each stop string is matched by the automaton of Knuth, Morris & Pratt (1977): its state is the longest prefix of
    the stop that ends the text so far, so a piece is read once, character by character, and what came before it is
    never compared again. A piece of ``c`` characters costs ``O(c x stops)`` (amortized), however long the text and
    the stops; building the automata costs ``O(total length of the stops)`` once.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ConfigError("stop strings must not be empty")
        self.stops = list(stops)
        self.fallback = [_fallback(s) for s in self.stops]
        self.matched = [0] * len(self.stops)  # per stop: the longest prefix of it that ends the text
        self.length = 0  # characters fed so far

    @property
    def hold(self) -> int:
        """Characters at the end of the text that begin a stop string (0 once one was found)."""
        return max(self.matched, default=0)

    def feed(self, piece: str) -> int | None:
        """Add ``piece`` to the text: where the earliest stop string found in it begins (an index into the whole
        text), or None. The earliest in the text wins, whichever stop string was listed first."""
        first = None
        for j, stop in enumerate(self.stops):
            q, fallback = self.matched[j], self.fallback[j]
            for i, c in enumerate(piece):
                while q and stop[q] != c:
                    q = fallback[q - 1]
                if stop[q] == c:
                    q += 1
                if q == len(stop):  # found; a later match of the same stop begins later
                    start = self.length + i + 1 - q
                    first = start if first is None else min(first, start)
                    q = 0
                    break
            self.matched[j] = q
        self.length += len(piece)
        if first is not None:
            self.matched = [0] * len(self.stops)
        return first


def _fallback(stop: str) -> list[int]:
    """``out[i]``: the length of the longest proper prefix of ``stop`` that ends ``stop[:i + 1]`` (KMP's table)."""
    out = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = out[k - 1]
        if stop[i] == stop[k]:
            k += 1
        out[i] = k
    return out
