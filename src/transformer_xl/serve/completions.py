"""Completion requests on the engine: prompt text to ids, the engine's events to the protocol's objects.

:class:`Completions` checks what needs the vocabulary (token ids in range, prompt length), queues a
:class:`~transformer_xl.serve.engine.Job`, and turns its events into one ``text_completion`` object
(:meth:`Completions.complete`) or into server-sent events (:meth:`Completions.stream`: ``data: {chunk}`` lines,
then ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from transformer_xl.data.codec import TextCodec
from transformer_xl.inference.sampling import Penalties
from transformer_xl.serve.engine import Done, Engine, Failed, Finish, Job, PromptScores, Sampling, Token
from transformer_xl.serve.protocol import (
    DEFAULT_LIMITS,
    CompletionRequest,
    Limits,
    RequestError,
    completion_id,
    completion_object,
    error_body,
    usage_object,
)

#: Seconds between two checks that the client of a whole completion is still there.
POLL = 1.0


@dataclass
class _Choice:
    """A choice's text and log-probabilities as they accumulate."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class _Run:
    """One queued job and the queue its events arrive on (in the server's event loop)."""

    def __init__(self, job_args: dict, engine: Engine) -> None:
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

        def emit(event: Any) -> None:  # called from the engine thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens any more
                loop.call_soon_threadsafe(self.events.put_nowait, event)

        self.job = Job(emit=emit, **job_args)
        engine.submit(self.job)


class Completions:
    """Serve completion requests of one model (see the module docstring)."""

    def __init__(self, engine: Engine, codec: TextCodec, model_name: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.engine, self.codec, self.model_name, self.limits = engine, codec, model_name, limits

    # ------------------------------------------------------------------ prompts
    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """The ids of one prompt (words the vocabulary lacks become ``<unk>``); 400 when out of range or too long."""
        if isinstance(prompt, str):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ids = self.codec.encode(prompt)
        else:
            n_token = len(self.codec.vocab)
            if min(prompt) < 0 or max(prompt) >= n_token:
                raise RequestError(f"prompt token ids must lie in [0, {n_token})", param="prompt",
                                   code="invalid_value")
            ids = list(prompt)
        if len(ids) > self.limits.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(ids)} tokens; this server reads at most "
                               f"{self.limits.max_prompt_tokens} per prompt", param="prompt",
                               code="context_length_exceeded")
        return ids

    def token_text(self, token_id: int) -> str:
        """One token as text (a word, a character, or a byte's character)."""
        return self.codec.decode([token_id])

    def _queue(self, req: CompletionRequest) -> tuple[_Run, list[list[int]]]:
        if req.model is not None and req.model != self.model_name:
            raise RequestError(f"the model {req.model!r} does not exist; this server holds {self.model_name!r}",
                               status=404, param="model", code="model_not_found")
        prompts = [self.prompt_ids(p) for p in req.prompts]
        sampling = Sampling(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                            penalties=Penalties(req.repetition_penalty, req.no_repeat_ngram_size))
        args = dict(prompts=prompts, n=req.n, max_tokens=req.max_tokens, sampling=sampling, stop=req.stop,
                    seed=req.seed, top_logprobs=req.logprobs or 0, session=req.session,
                    score_prompt=req.echo and req.logprobs is not None)
        return _Run(args, self.engine), prompts

    # ------------------------------------------------------------------ events -> choices
    def _echo(self, req: CompletionRequest, prompts: list[list[int]], choices: list[_Choice]) -> None:
        for c, choice in enumerate(choices):
            p = c // req.n
            given = req.prompts[p]
            choice.text = given if isinstance(given, str) else self.codec.decode(given)
            if req.logprobs is not None:
                self._offsets(choice, prompts[p], 0)

    def _offsets(self, choice: _Choice, ids: list[int], start: int) -> None:
        decoder, at = self.codec.decoder(), start
        for t in ids:
            choice.tokens.append(self.token_text(t))
            choice.text_offset.append(at)
            at += len(decoder.feed([t]))

    def _apply(self, req: CompletionRequest, choices: list[_Choice], event: Any) -> dict | None:
        """Add ``event`` to ``choices``; the streamed choice delta it makes (None: nothing to send)."""
        if isinstance(event, PromptScores):
            for c in range(event.prompt * req.n, (event.prompt + 1) * req.n):
                choices[c].token_logprobs[:0] = event.log_probs
                choices[c].top_logprobs[:0] = [None] * len(event.log_probs)
            return None
        choice = choices[event.choice]
        delta: dict[str, Any] = {"index": event.choice, "text": event.text, "logprobs": None, "finish_reason": None}
        if isinstance(event, Token) and req.logprobs is not None:
            top = {self.token_text(i): lp for i, lp in (event.top or [])}
            lp = {"tokens": [self.token_text(event.token_id)], "token_logprobs": [event.log_prob],
                  "top_logprobs": [top], "text_offset": [len(choice.text)]}
            for key, value in lp.items():
                getattr(choice, key).extend(value)
            delta["logprobs"] = lp
        if isinstance(event, Finish):
            choice.finish_reason = delta["finish_reason"] = event.reason
        choice.text += event.text
        return delta if delta["text"] or delta["logprobs"] or delta["finish_reason"] else None

    def _logprobs(self, choice: _Choice) -> dict:
        return {"tokens": choice.tokens, "token_logprobs": choice.token_logprobs,
                "top_logprobs": choice.top_logprobs, "text_offset": choice.text_offset}

    # ------------------------------------------------------------------ the two response forms
    async def complete(self, req: CompletionRequest, disconnected: Callable[[], Awaitable[bool]]) -> dict:
        """The whole ``text_completion`` object (the job is cancelled when ``disconnected()`` turns true)."""
        run, prompts = self._queue(req)
        choices = [_Choice() for _ in range(len(prompts) * req.n)]
        if req.echo:
            self._echo(req, prompts, choices)
        try:
            checked = time.monotonic()
            while True:
                try:
                    event = await asyncio.wait_for(run.events.get(), timeout=POLL)
                except asyncio.TimeoutError:
                    event = None  # a quiet second: queued, or reading a long prompt
                if time.monotonic() - checked >= POLL:  # a running job sends its events without pause
                    if await disconnected():
                        raise RequestError("the client went away", status=499) from None
                    checked = time.monotonic()
                if event is None:
                    continue
                if isinstance(event, Failed):
                    raise RequestError(f"the completion failed: {event.message}", status=500, kind="server_error")
                if isinstance(event, Done):
                    break
                self._apply(req, choices, event)
        finally:
            run.job.cancelled = True  # nothing to do when it finished
        out = [{"index": i, "text": c.text, "logprobs": self._logprobs(c) if req.logprobs is not None else None,
                "finish_reason": c.finish_reason} for i, c in enumerate(choices)]
        return completion_object(completion_id(), self.model_name, out,
                                 usage_object(event.prompt_tokens, event.completion_tokens), int(time.time()))

    def stream(self, req: CompletionRequest) -> AsyncIterator[str]:
        """Queue the request now (a refusal raises here, before any byte is sent); its server-sent events."""
        run, prompts = self._queue(req)
        return self._sse(req, run, prompts)

    async def _sse(self, req: CompletionRequest, run: _Run, prompts: list[list[int]]) -> AsyncIterator[str]:
        cid, created = completion_id(), int(time.time())
        choices = [_Choice() for _ in range(len(prompts) * req.n)]

        def chunk(deltas: list[dict], usage: dict | None = None) -> str:
            return "data: " + json.dumps(completion_object(cid, self.model_name, deltas, usage, created)) + "\n\n"

        try:
            if req.echo and not (req.logprobs is not None):
                self._echo(req, prompts, choices)
                yield chunk([{"index": i, "text": c.text, "logprobs": None, "finish_reason": None}
                             for i, c in enumerate(choices)])
            while True:
                event = await run.events.get()
                if isinstance(event, Failed):
                    yield "data: " + json.dumps(error_body(f"the completion failed: {event.message}",
                                                           kind="server_error")) + "\n\n"
                    break
                if isinstance(event, Done):
                    if req.include_usage:
                        yield chunk([], usage_object(event.prompt_tokens, event.completion_tokens))
                    break
                if isinstance(event, PromptScores) and req.echo:  # the prompt, with its scores, first
                    part = [_Choice() for _ in choices]
                    self._echo(req, prompts, part)
                    self._apply(req, part, event)
                    for c in range(event.prompt * req.n, (event.prompt + 1) * req.n):
                        choices[c].text = part[c].text  # the offsets of the new tokens count the prompt's text
                    yield chunk([{"index": c, "text": part[c].text, "logprobs": self._logprobs(part[c]),
                                  "finish_reason": None} for c in range(event.prompt * req.n,
                                                                         (event.prompt + 1) * req.n)])
                    continue
                delta = self._apply(req, choices, event)
                if delta is not None:
                    yield chunk([delta])
            yield "data: [DONE]\n\n"
        finally:
            run.job.cancelled = True  # a client that went away frees its rows at the next step
