"""Completion requests on the engine: prompt text to ids, the engine's events to the protocol's objects.

:class:`Completions` checks what needs the vocabulary (token ids in range, prompt length), queues a
:class:`~transformer_xl.serve.engine.Job`, and turns its events into one ``text_completion`` object
(:meth:`Completions.complete`) or into server-sent events (:meth:`Completions.stream`: ``data: {chunk}`` lines,
then ``data: [DONE]``). Prompts are encoded and queued in a worker thread, so that a long prompt does not stall the
event loop (other requests, streams); a text prompt is refused by its length before it is encoded. A request that
names a ``session`` says whether it started empty (``"session_reset"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
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
    check_prompt_chars,
    completion_id,
    completion_object,
    error_body,
    usage_object,
)
from transformer_xl.serve.tokens import encode_text

#: Seconds between two checks that the client of a whole completion is still there.
POLL = 0.25


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
    """One request's job and the queue its events arrive on (in the server's event loop ``loop``). The job is made
    and queued in a worker thread (:meth:`submit`); the request may go away meanwhile (:meth:`leave`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.job: Job | None = None
        self.engine: Engine | None = None
        self.gone = False
        self.session_reset = False  # the session it names started empty: new, evicted or expired
        self._lock = threading.Lock()

    def _emit(self, event: Any) -> None:  # called from the engine thread
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def submit(self, job_args: dict, engine: Engine) -> None:
        """Queue the job (not when the request has gone already)."""
        job = Job(emit=self._emit, **job_args)
        with self._lock:
            if self.gone:
                return
            engine.submit(job)
            self.job, self.engine = job, engine
        self.session_reset = job.session is not None and job.state is None

    def leave(self) -> None:
        """The request ended or went away: a job not yet queued never is; a waiting one leaves the queue at once, a
        running one the batch at the next step (:meth:`Engine.cancel`)."""
        with self._lock:
            self.gone = True
            if self.job is not None and self.engine is not None:
                self.engine.cancel(self.job)  # nothing to do when it finished


class _Events:
    """A request's server-sent events whose closing always ends its job: also before the first event (an async
    generator closed before it started never runs its ``finally``)."""

    def __init__(self, events: AsyncIterator[str], run: _Run) -> None:
        self.events, self.run = events, run

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> str:
        return await self.events.__anext__()

    async def aclose(self) -> None:
        try:
            await self.events.aclose()  # type: ignore[attr-defined]
        finally:
            self.run.leave()


class Completions:
    """Serve completion requests of one model (see the module docstring)."""

    def __init__(self, engine: Engine, codec: TextCodec, model_name: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.engine, self.codec, self.model_name, self.limits = engine, codec, model_name, limits

    # ------------------------------------------------------------------ prompts
    def check_chars(self, prompt: str | list[int]) -> None:
        """400 for a text prompt longer than ``limits.max_prompt_chars`` (checked before it is encoded)."""
        if isinstance(prompt, str):
            check_prompt_chars(prompt, self.limits)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """The ids of one prompt (words the vocabulary lacks become ``<unk>``); 400 when out of range or too long
        (a text prompt's characters are counted before it is encoded). Runs in the caller's thread."""
        self.check_chars(prompt)
        if isinstance(prompt, str):
            ids = encode_text(self.codec, prompt)  # silently, one encoder at a time (worker threads share warnings)
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

    def _queue(self, req: CompletionRequest, run: _Run) -> list[list[int]]:
        if req.model is not None and req.model != self.model_name:
            raise RequestError(f"the model {req.model!r} does not exist; this server holds {self.model_name!r}",
                               status=404, param="model", code="model_not_found")
        for prompt in req.prompts:  # every prompt's length before any is encoded
            self.check_chars(prompt)
        prompts = [self.prompt_ids(p) for p in req.prompts]
        sampling = Sampling(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                            penalties=Penalties(req.repetition_penalty, req.no_repeat_ngram_size))
        args = dict(prompts=prompts, n=req.n, max_tokens=req.max_tokens, sampling=sampling, stop=req.stop,
                    seed=req.seed, top_logprobs=req.logprobs or 0, session=req.session,
                    score_prompt=req.echo and req.logprobs is not None)
        run.submit(args, self.engine)
        return prompts

    async def _queued(self, req: CompletionRequest) -> tuple[_Run, list[list[int]]]:
        """Encode and queue ``req`` in a worker thread: the event loop serves other requests meanwhile (a long prompt
        takes a while to encode). A refusal raises here."""
        run = _Run(asyncio.get_running_loop())
        try:
            prompts = await asyncio.to_thread(self._queue, req, run)
        except asyncio.CancelledError:  # the request went away while its prompts were encoded
            run.leave()
            raise
        return run, prompts

    # ------------------------------------------------------------------ events -> choices
    def _echo(self, req: CompletionRequest, prompts: list[list[int]], choices: list[_Choice], first: int = 0) -> None:
        """Put its prompt (text, and tokens and offsets with ``logprobs``) in each of ``choices``, the choices from
        index ``first`` on."""
        for c, choice in enumerate(choices, first):
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

    def _top(self, top: list[tuple[int, float]] | None) -> dict[str, float]:
        """``top_logprobs`` of one position: token text -> log-probability, most likely first (of two ids with one
        text, the likelier)."""
        out: dict[str, float] = {}
        for i, lp in top or []:
            out.setdefault(self.token_text(i), lp)
        return out

    def _scores(self, event: PromptScores, choices: list[_Choice]) -> None:
        """Put the scores of a prompt before what each of its ``choices`` holds: a list of its own for each choice,
        the ``top_logprobs`` dicts built once per prompt and shared by its choices (nothing changes them later)."""
        tops = [None if t is None else self._top(t) for t in event.top]
        for choice in choices:
            choice.token_logprobs[:0] = event.log_probs
            choice.top_logprobs[:0] = tops

    def _apply(self, req: CompletionRequest, choices: list[_Choice], event: Any) -> dict | None:
        """Add ``event`` to ``choices``; the streamed choice delta it makes (None: nothing to send)."""
        if isinstance(event, PromptScores):
            self._scores(event, choices[event.prompt * req.n:(event.prompt + 1) * req.n])
            return None
        choice = choices[event.choice]
        delta: dict[str, Any] = {"index": event.choice, "text": event.text, "logprobs": None, "finish_reason": None}
        if isinstance(event, Token) and req.logprobs is not None:
            top = self._top(event.top)
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
        run, prompts = await self._queued(req)
        choices = [_Choice() for _ in range(len(prompts) * req.n)]
        if req.echo:  # a long prompt's texts and offsets: in a worker thread, as is everything sized by a prompt
            await asyncio.to_thread(self._echo, req, prompts, choices)
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
                if isinstance(event, PromptScores):
                    await asyncio.to_thread(self._apply, req, choices, event)
                else:
                    self._apply(req, choices, event)
        finally:
            run.leave()  # nothing to do when it finished
        out = [{"index": i, "text": c.text, "logprobs": self._logprobs(c) if req.logprobs is not None else None,
                "finish_reason": c.finish_reason} for i, c in enumerate(choices)]
        doc = completion_object(completion_id(), self.model_name, out,
                                usage_object(event.prompt_tokens, event.completion_tokens), int(time.time()))
        return _mark_session(doc, req, run)

    async def stream(self, req: CompletionRequest) -> AsyncIterator[str]:
        """Encode and queue the request (in a worker thread; a refusal raises on the await, before any byte is
        sent); its server-sent events: ``events = await completions.stream(req)``."""
        run, prompts = await self._queued(req)
        return _Events(self._sse(req, run, prompts), run)

    async def _sse(self, req: CompletionRequest, run: _Run, prompts: list[list[int]]) -> AsyncIterator[str]:
        cid, created = completion_id(), int(time.time())
        choices = [_Choice() for _ in range(len(prompts) * req.n)]

        sent = [False]

        def chunk(deltas: list[dict], usage: dict | None = None) -> str:
            doc = completion_object(cid, self.model_name, deltas, usage, created)
            if not sent[0]:  # the first chunk says whether a session started empty
                sent[0] = True
                doc = _mark_session(doc, req, run)
            return "data: " + json.dumps(doc) + "\n\n"

        def prompt_chunk(event: PromptScores) -> str:  # the choices of event.prompt only: linear in the prompts
            first = event.prompt * req.n
            part = [_Choice() for _ in range(req.n)]
            self._echo(req, prompts, part, first)
            self._scores(event, part)
            for c, choice in enumerate(part, first):
                choices[c].text = choice.text  # the offsets of the new tokens count the prompt's text
            return chunk([{"index": c, "text": choice.text, "logprobs": self._logprobs(choice),
                           "finish_reason": None} for c, choice in enumerate(part, first)])

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
                    yield await asyncio.to_thread(prompt_chunk, event)  # sized by the prompt: off the loop
                    continue
                delta = self._apply(req, choices, event)
                if delta is not None:
                    yield chunk([delta])
            yield "data: [DONE]\n\n"
        finally:
            run.leave()  # a client that went away frees its rows at the next step


def _mark_session(doc: dict, req: CompletionRequest, run: _Run) -> dict:
    """``session_reset`` on a response (or the first chunk) of a request naming a session: true when the session
    started empty (new, evicted or expired: nothing of an earlier text was remembered), false when it continued."""
    if req.session is not None:
        doc["session_reset"] = run.session_reset
    return doc
