"""The engine without HTTP: batched one-token steps give every request its own tokens, cancelled requests leave."""

from __future__ import annotations

import queue
import threading

import pytest

from tests.helpers import generation_model
from transformer_xl.data import Vocab
from transformer_xl.data.codec import TextCodec
from transformer_xl.inference.generate import advance
from transformer_xl.serve.engine import Done, Engine, Failed, Finish, Job, PromptScores, Sampling, Token
from transformer_xl.serve.protocol import RequestError
from transformer_xl.serve.sessions import SessionStore


@pytest.fixture(scope="module")
def parts():
    model = generation_model(n_token=40, mem_len=8)
    codec = TextCodec(Vocab([f"w{i}" for i in range(40)]), "word")
    return model, codec


def _run(engine: Engine, **kw) -> tuple[queue.Queue, Job]:
    events: queue.Queue = queue.Queue()
    job = Job(emit=events.put, **kw)
    engine.submit(job)
    return events, job


def _collect(events: queue.Queue) -> tuple[dict[int, list[int]], list]:
    tokens: dict[int, list[int]] = {}
    seen = []
    while True:
        ev = events.get(timeout=60)
        seen.append(ev)
        if isinstance(ev, Token):
            tokens.setdefault(ev.choice, []).append(ev.token_id)
        if isinstance(ev, (Done, Failed)):
            return tokens, seen


def test_batched_rows_get_the_tokens_of_their_own_generation(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, max_batch=16).start()
    try:
        prompts = [[(7 * i + j) % 40 for j in range(1 + i % 11)] for i in range(12)]  # memories of many lengths
        runs = [_run(engine, prompts=[p], max_tokens=9, sampling=Sampling(temperature=0)) for p in prompts]
        for p, (events, _) in zip(prompts, runs):
            tokens, seen = _collect(events)
            assert tokens[0] == model.generate(p, max_new_tokens=9).new_tokens[0].tolist()
            assert isinstance(seen[-1], Done) and seen[-1].completion_tokens == 9
            assert isinstance(seen[-2], Finish) and seen[-2].reason == "length"
        assert engine.peak_batch > 1
    finally:
        engine.stop()


def test_log_probs_and_prompt_scores_are_the_models(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec).start()
    try:
        prompt = [3, 1, 4, 1, 5, 9, 2, 6]
        events, _ = _run(engine, prompts=[prompt], max_tokens=4, sampling=Sampling(temperature=0),
                         score_prompt=True, top_logprobs=2)
        _, seen = _collect(events)
        out = model.generate(prompt, max_new_tokens=4)
        assert [e.log_prob for e in seen if isinstance(e, Token)] == pytest.approx(out.log_probs[0].tolist(), abs=1e-5)
        scores = next(e for e in seen if isinstance(e, PromptScores)).log_probs
        assert scores[0] is None and len(scores) == len(prompt)
        for t in range(1, len(prompt)):  # the score of id t is what the model gives it after prompt[:t]
            after, _ = advance(model, prompt[:t])
            assert scores[t] == pytest.approx(float(after[0, prompt[t]]), abs=1e-5)
        first = next(e for e in seen if isinstance(e, Token))
        assert first.top[0][0] == first.token_id and len(first.top) == 2
    finally:
        engine.stop()


def test_a_cancelled_request_frees_its_rows(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, max_batch=2).start()
    try:
        events, job = _run(engine, prompts=[[1, 2]], max_tokens=2000, sampling=Sampling(temperature=0))
        assert isinstance(events.get(timeout=60), Token)
        waiting, _ = _run(engine, prompts=[[3]], n=2, max_tokens=3, sampling=Sampling(temperature=0))
        job.cancelled = True
        _, seen = _collect(events)
        assert isinstance(seen[-1], Failed)
        tokens, last = _collect(waiting)  # it needed both rows: it ran once the cancelled one left
        assert isinstance(last[-1], Done) and len(tokens[0]) == len(tokens[1]) == 3
        assert engine.stats()["running"] == 0
    finally:
        engine.stop()


def test_requests_beyond_the_batch_or_queue_are_refused(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, max_batch=2, max_queue=1)  # not started: the queue fills
    with pytest.raises(RequestError, match="--max-batch"):
        engine.submit(Job(prompts=[[1]], n=3, emit=print))
    engine.submit(Job(prompts=[[1]], emit=print))
    with pytest.raises(RequestError) as info:
        engine.submit(Job(prompts=[[1]], emit=print))
    assert info.value.status == 503


def test_a_session_keeps_the_memory_of_its_text(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, sessions=SessionStore(4), mem_len=64).start()
    try:
        events, _ = _run(engine, prompts=[[5, 6, 7]], max_tokens=4, sampling=Sampling(temperature=0), session="s")
        first, _ = _collect(events)
        events, _ = _run(engine, prompts=[[8, 9]], max_tokens=5, sampling=Sampling(temperature=0), session="s")
        second, seen = _collect(events)
        whole = model.generate([5, 6, 7, *first[0], 8, 9], max_new_tokens=5, mem_len=64)
        assert second[0] == whole.new_tokens[0].tolist()
        log_probs = [e.log_prob for e in seen if isinstance(e, Token)]
        assert log_probs == pytest.approx(whole.log_probs[0].tolist(), abs=1e-5)
    finally:
        engine.stop()


def test_the_engine_thread_survives_a_failing_request(parts, monkeypatch) -> None:
    model, codec = parts
    engine = Engine(model, codec).start()
    try:
        calls = threading.Event()

        def broken(row):
            calls.set()
            raise RuntimeError("boom")

        monkeypatch.setattr(engine, "_choose", broken)
        events, _ = _run(engine, prompts=[[1]], max_tokens=2)
        _, seen = _collect(events)
        assert isinstance(seen[-1], Failed) and "boom" in seen[-1].message and calls.is_set()
        monkeypatch.undo()
        events, _ = _run(engine, prompts=[[1]], max_tokens=2)
        assert isinstance(_collect(events)[1][-1], Done)
    finally:
        engine.stop()
