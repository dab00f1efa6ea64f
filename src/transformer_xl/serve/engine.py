"""The decoding engine of ``txl serve``: one thread owns the model and advances every running completion together.

Each choice of a request is a *row* with its own memories (``n_layer + 1`` tensors ``[1, m, d_model]``). A loop
iteration (1) admits waiting requests in arrival order while the running rows stay within ``max_batch``, reading
each prompt (:func:`transformer_xl.inference.generate.advance`, in segments of ``tgt_len``); (2) chooses the next
token of every row from its own log-probabilities and sampling settings and sends it to its request; (3) reads
the chosen tokens of all rows whose memories have the same length as **one** ``[G, 1]`` step over their memories
stacked on the batch axis (continuous batching over the one-token step: a request joins or leaves the batch at any
step). Rows with shorter memories (prompts shorter than ``mem_len``, for their first tokens) form their own groups,
so no padding or mask is needed. A cancelled request (a client that went away, :meth:`Engine.cancel`) leaves the
queue at once, wherever it waits, and the batch at the next step.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from transformer_xl.data.codec import TextCodec
from transformer_xl.errors import check_int
from transformer_xl.inference.generate import advance
from transformer_xl.inference.prompt_scores import score_prompt
from transformer_xl.inference.sampling import Penalties, choose_next, penalize
from transformer_xl.inference.text import SampleText
from transformer_xl.model import TransformerXLLM
from transformer_xl.serve.memory import release_free_memory
from transformer_xl.serve.protocol import RequestError
from transformer_xl.serve.sessions import TAIL, SessionState, SessionStore

log = logging.getLogger("txl.serve")


@dataclass(frozen=True)
class Sampling:
    """How one request chooses its tokens (temperature 0: greedy)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    penalties: Penalties = field(default_factory=Penalties)


@dataclass
class Token:
    """One new token of a choice, and the text that became final with it."""

    choice: int
    token_id: int
    log_prob: float  # the model's natural-log probability of it (before temperature and filtering)
    text: str
    top: list[tuple[int, float]] | None = None  # the most likely ids and their log-probabilities


@dataclass
class Finish:
    """A choice ended: ``stop`` (a stop string) or ``length``; ``text`` is what was still held back."""

    choice: int
    reason: str
    text: str = ""


@dataclass
class PromptScores:
    """The log-probability of every prompt id after its predecessor (None for the first), for ``echo``, and the
    ``top_logprobs`` most likely ids and their log-probabilities at each of those positions (None for the first)."""

    prompt: int
    log_probs: list[float | None]
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)


@dataclass
class Done:
    """The request finished; its token counts."""

    prompt_tokens: int
    completion_tokens: int


@dataclass
class Failed:
    """The request could not be completed (a bug, or the server stopping)."""

    message: str


@dataclass
class Job:
    """One completion request as the engine runs it: every prompt (ids) times ``n`` choices."""

    prompts: list[list[int]]
    emit: Callable[[Any], None]  # called from the engine thread with Token/Finish/PromptScores/Done/Failed
    n: int = 1
    max_tokens: int = 16
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    score_prompt: bool = False
    session: str | None = None
    state: SessionState | None = None  # the session's memory when the job was queued
    cancelled: bool = False  # set by the request's side when its client went away
    completion_tokens: int = 0

    @property
    def size(self) -> int:
        """Rows the job adds to the batch."""
        return len(self.prompts) * self.n


@dataclass
class _Row:
    job: Job
    choice: int
    mems: list[Tensor]
    log_probs: Tensor  # [V] of the next token
    history: list[int]  # every id of its text so far (for the penalties)
    text: SampleText
    generator: torch.Generator | None
    produced: int = 0
    read: int = 0  # ids read into the memories, over the whole session
    pending: int | None = None  # the id chosen last, not yet read
    done: bool = False


class Engine:
    """Runs :class:`Job` s on ``model`` in a background thread (see the module docstring)."""

    def __init__(self, model: TransformerXLLM, codec: TextCodec, *, max_batch: int = 8, max_queue: int = 256,
                 mem_len: int | None = None, clamp_len: int | None = None,
                 sessions: SessionStore | None = None) -> None:
        self.model, self.codec = model, codec
        self.max_batch = check_int("max_batch", max_batch, 1)
        self.max_queue = check_int("max_queue", max_queue, 1)
        self.lengths = dict(mem_len=mem_len, clamp_len=clamp_len)
        self.sessions = sessions if sessions is not None else SessionStore()
        self._queue: deque[Job] = deque()
        self._rows: list[_Row] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._worked = False  # requests ran since the engine was last idle
        self.peak_batch = 0  # the most rows read as one step so far
        self.cancelled = 0  # requests ended because their client went away
        self._thread = threading.Thread(target=self._run, name="txl-serve-engine", daemon=True)

    # ------------------------------------------------------------------ the request side
    def start(self) -> Engine:
        """Start the engine thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; waiting and running jobs get :class:`Failed`."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)  # pragma: no mutate (it ends at its next step; the bound is for a stuck one)

    def submit(self, job: Job) -> None:
        """Queue ``job`` (503 when the queue is full); a session it names is reserved until it ends."""
        if job.size > self.max_batch:
            raise RequestError(f"the request needs {job.size} rows but the server batches at most {self.max_batch} "
                               "(--max-batch)", param="n")
        with self._wake:
            if len(self._queue) >= self.max_queue:
                raise RequestError("the server is busy (request queue full), try again", status=503,
                                   kind="server_error", code="queue_full")
            if job.session is not None:
                job.state = self.sessions.acquire(job.session)
            self._queue.append(job)
            self._wake.notify()

    def cancel(self, job: Job) -> None:
        """The client of ``job`` went away: a waiting job leaves the queue at once (its session and queue place are
        free again), a running one leaves the batch at the next step; nothing happens to a job that has ended."""
        with self._wake:
            job.cancelled = True
            self._wake.notify()

    def stats(self) -> dict[str, int]:
        """Running rows, waiting requests, kept sessions."""
        return {"running": len(self._rows), "waiting": len(self._queue), "sessions": len(self.sessions),
                "peak_batch": self.peak_batch, "cancelled": self.cancelled}

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        while True:
            with self._wake:
                self._drop_cancelled()
                busy = bool(self._stopping or self._queue or self._rows)
                if not (busy or self._worked):
                    self._wake.wait()  # a submit, a cancel or stop() wakes it
                    continue
                release, self._worked = not busy, busy
                if self._stopping:
                    break
                admitted = [] if release else self._admit()
            if release:  # idle: what the last requests freed goes back to the system (unlocked: submit() goes on)
                release_free_memory()
                continue
            for job in admitted:
                self._guard([job], self._start, job)
            self._guard({id(r.job): r.job for r in self._rows}.values(), self._step)
        for job in [*self._queue, *{id(r.job): r.job for r in self._rows}.values()]:  # each job once, not per row
            self._end(job, Failed("the server is stopping"))

    def _drop_cancelled(self) -> None:
        """End every waiting job whose client went away, wherever it waits and whether or not the batch has room,
        releasing its session and its queue place (called holding ``_wake``)."""
        kept: deque[Job] = deque()
        gone: list[Job] = []
        for job in self._queue:  # one read of each flag: a job is either kept or ended
            (gone if job.cancelled else kept).append(job)
        self._queue = kept
        for job in gone:
            self.cancelled += 1
            self._end(job, Failed("cancelled"))

    def _admit(self) -> list[Job]:
        running = len(self._rows)
        jobs = []
        while self._queue and (running + self._queue[0].size <= self.max_batch or not running):
            job = self._queue.popleft()
            running += job.size
            jobs.append(job)
        return jobs

    def _guard(self, jobs: Any, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn``; an exception fails ``jobs`` (and only them), never the thread."""
        jobs = list(jobs)
        try:
            fn(*args)
        except Exception as exc:
            log.exception("txl serve: a request failed")
            for job in jobs:
                self._end(job, Failed(f"{type(exc).__name__}: {exc}"))

    def _end(self, job: Job, last: Any) -> None:
        """Remove ``job``'s rows, release its session (keeping the new memory when it completed), send ``last``."""
        rows = [r for r in self._rows if r.job is job]
        self._rows = [r for r in self._rows if r.job is not job]
        if job.session is not None:
            state = None
            if isinstance(last, Done) and rows:
                row = rows[0]
                state = SessionState(mems=row.mems, pending=[] if row.pending is None else [row.pending],
                                     tail=row.history[-TAIL:], tokens=row.read)
            self.sessions.release(job.session, state)
        job.emit(last)

    def _start(self, job: Job) -> None:
        """Read the prompts of ``job`` (after its session's memory) and add its rows."""
        if job.cancelled:  # its client went away while it waited
            self.cancelled += 1
            return self._end(job, Failed("cancelled"))
        state = job.state
        generator = torch.Generator().manual_seed(job.seed) if job.seed is not None else None
        rows = []
        for p, ids in enumerate(job.prompts):
            before, after = (state.pending, state.mems) if state else ([], None)
            if job.score_prompt:  # segment by segment: never a [T, V] table (transformer_xl.inference.prompt_scores)
                scored = score_prompt(self.model, ids, before=before, top=job.top_logprobs, mems=after,
                                      **self.lengths)
                job.emit(PromptScores(p, scored.log_probs, scored.top))
                log_probs, mems = scored.next_log_probs, scored.mems
            else:
                table, mems = advance(self.model, [before + ids], mems=after, **self.lengths)
                log_probs = table[0]  # [V] of a [1, V] table
            context = (state.tail if state else []) + ids  # the tail ends with the pending id
            read = (state.tokens if state else 0) + len(before) + len(ids)
            for k in range(job.n):
                rows.append(_Row(job, p * job.n + k, mems, log_probs, list(context),
                                 SampleText(self.codec, context, job.stop), generator, read=read))
        self._rows.extend(rows)
        if job.max_tokens == 0:
            for row in rows:
                row.done = True  # pragma: no mutate (the rows leave with the job on the next lines)
                job.emit(Finish(row.choice, "length"))
            self._end(job, Done(sum(map(len, job.prompts)), 0))

    def _step(self) -> None:
        """Choose a token for every row, end what is finished, read the chosen tokens in batched groups."""
        for job in {id(r.job): r.job for r in self._rows if r.job.cancelled}.values():
            self.cancelled += 1
            self._end(job, Failed("cancelled"))
        for row in self._rows:
            self._choose(row)
        for job in {id(r.job): r.job for r in self._rows}.values():
            if all(r.done for r in self._rows if r.job is job):
                self._end(job, Done(sum(map(len, job.prompts)), job.completion_tokens))
        groups: dict[int, list[_Row]] = {}
        for row in self._rows:
            if not row.done:
                groups.setdefault(row.mems[0].size(1), []).append(row)
        for group in groups.values():
            for i in range(0, len(group), self.max_batch):
                self._advance(group[i:i + self.max_batch])

    def _choose(self, row: _Row) -> None:
        if row.done:
            return
        job, s = row.job, row.job.sampling
        scores = penalize(row.log_probs[None], [row.history], s.penalties)
        tok = int(choose_next(scores, do_sample=s.temperature > 0, temperature=s.temperature, top_k=s.top_k,
                              top_p=s.top_p, min_p=s.min_p, generator=row.generator)[0])
        top = None
        if job.top_logprobs:
            values, ids = torch.topk(row.log_probs, min(job.top_logprobs, row.log_probs.numel()))
            top = list(zip(ids.tolist(), values.tolist()))
        row.produced += 1
        job.completion_tokens += 1
        row.history.append(tok)
        row.pending = tok
        piece = row.text.feed(tok)
        job.emit(Token(row.choice, tok, float(row.log_probs[tok]), piece, top))
        if row.text.done or row.produced >= job.max_tokens:
            row.done = True
            rest = row.text.close()
            job.emit(Finish(row.choice, "stop" if row.text.finish_reason == "stop_string" else "length", rest))

    def _advance(self, group: list[_Row]) -> None:
        """Read the pending token of every row of ``group`` (equal memory lengths) as one batched step."""
        self.peak_batch = max(self.peak_batch, len(group))
        toks = torch.tensor([[r.pending] for r in group])  # [G, 1]
        mems = [torch.cat([r.mems[i] for r in group], 0) for i in range(len(group[0].mems))]  # [G, m, D] each
        log_probs, new = advance(self.model, toks, mems=mems, **self.lengths)  # [G, V]
        for g, row in enumerate(group):
            row.mems = [m[g:g + 1] for m in new]
            row.log_probs = log_probs[g]
            row.pending = None  # pragma: no mutate (a row chooses its next id before it is read or kept again)
            row.read += 1
