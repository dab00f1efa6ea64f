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
from transformer_xl.inference.generate import stream
from transformer_xl.model import TransformerXLLM


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
