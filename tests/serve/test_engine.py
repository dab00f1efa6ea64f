"""The engine without HTTP: batched one-token steps give every request its own tokens, cancelled requests leave."""

from __future__ import annotations

import logging
import queue
import threading
import time

import pytest
import torch

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
        assert first.top[0] == (first.token_id, pytest.approx(first.log_prob)) and len(first.top) == 2
        assert first.top[1][1] == pytest.approx(float(advance(model, prompt)[0][0].topk(2).values[1]), abs=1e-5)
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
        assert engine.stats()["running"] == 0 and engine.stats()["cancelled"] == 1
        _, seen = _collect(_run(engine, prompts=[[3]], cancelled=True)[0])  # its client left while it waited
        assert seen == [Failed("cancelled")] and engine.stats()["cancelled"] == 2
    finally:
        engine.stop()


def test_requests_cancelled_in_the_same_step_all_leave_at_the_next(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec)
    log: list[tuple[str, object]] = []
    jobs: list[Job] = []

    def emit(name: str, ev: object) -> None:
        log.append((name, ev))
        if name == "a" and isinstance(ev, Token) and [n for n, e in log if isinstance(e, Token)].count("a") == 2:
            for job in jobs:  # both clients go away at once, during a step
                job.cancelled = True
            log.append(("cancel", None))

    for name in ("a", "b"):
        jobs.append(Job(prompts=[[1]], max_tokens=1000, sampling=Sampling(temperature=0),
                        emit=lambda ev, name=name: emit(name, ev)))
        engine.submit(jobs[-1])
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while sum(isinstance(ev, Failed) for _, ev in log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.stop()
    after = log[log.index(("cancel", None)) + 1:]
    assert [n for n, ev in after if isinstance(ev, Token)] == ["b"]  # b's token of that step, then none
    assert sorted((n, ev) for n, ev in after if isinstance(ev, Failed)) == [("a", Failed("cancelled")),
                                                                           ("b", Failed("cancelled"))]
    assert engine.stats()["cancelled"] == 2


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


def test_the_engine_thread_survives_a_failing_request(parts, monkeypatch, caplog) -> None:
    model, codec = parts
    engine = Engine(model, codec)
    calls = threading.Event()

    def broken(row):
        calls.set()
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "_choose", broken)
    both = [_run(engine, prompts=[[1]], max_tokens=2)[0] for _ in range(2)]  # queued: one step reads them both
    try:
        with caplog.at_level(logging.ERROR, logger="txl.serve"):
            engine.start()
            for events in both:  # the step failed them both, and was logged once
                assert _collect(events)[1][-1] == Failed("RuntimeError: boom") and calls.is_set()
        assert [(r.getMessage(), r.exc_info[0]) for r in caplog.records] == [("txl serve: a request failed",
                                                                              RuntimeError)]
        monkeypatch.undo()
        events, _ = _run(engine, prompts=[[1]], max_tokens=2)
        assert isinstance(_collect(events)[1][-1], Done)
    finally:
        engine.stop()


def test_sampling_settings_and_seed_draw_what_generate_draws(parts) -> None:
    """Each setting reaches the sampler: a seeded request draws the tokens ``model.generate`` draws with it."""
    from transformer_xl.inference.sampling import Penalties

    model, codec = parts
    engine = Engine(model, codec).start()
    prompt = [3, 1, 4, 1, 5]
    cases = [(Sampling(temperature=0.7, top_k=5), dict(do_sample=True, temperature=0.7, top_k=5)),
             (Sampling(temperature=1.3, top_p=0.8), dict(do_sample=True, temperature=1.3, top_p=0.8)),
             (Sampling(min_p=0.3), dict(do_sample=True, min_p=0.3)),
             (Sampling(temperature=0, penalties=Penalties(1.5, 2)),
              dict(repetition_penalty=1.5, no_repeat_ngram_size=2))]
    try:
        for sampling, kw in cases:
            tokens, seen = _collect(_run(engine, prompts=[prompt], max_tokens=20, sampling=sampling, seed=11)[0])
            assert tokens[0] == model.generate(prompt, max_new_tokens=20, seed=11, **kw).new_tokens[0].tolist(), kw
            assert all(e.top is None for e in seen if isinstance(e, Token))  # no top log-probabilities asked for
    finally:
        engine.stop()


def test_several_prompts_times_n_choices_and_a_zero_token_request(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec).start()
    try:
        prompts = [[3, 1, 4], [2, 7, 1, 8, 2]]
        tokens, seen = _collect(_run(engine, prompts=prompts, n=2, max_tokens=3, sampling=Sampling(temperature=0),
                                     score_prompt=True)[0])
        for choice in range(4):  # prompt p's choices are p * n + k
            expected = model.generate(prompts[choice // 2], max_new_tokens=3).new_tokens[0].tolist()
            assert tokens[choice] == expected
        scores = [e for e in seen if isinstance(e, PromptScores)]
        assert [(s.prompt, len(s.log_probs)) for s in scores] == [(0, 3), (1, 5)]
        assert seen[-1] == Done(prompt_tokens=8, completion_tokens=12)
        _, seen = _collect(_run(engine, prompts=prompts, n=2, max_tokens=0, score_prompt=True)[0])
        assert [type(e) for e in seen] == [PromptScores, PromptScores, Finish, Finish, Finish, Finish, Done]
        assert [(e.choice, e.reason, e.text) for e in seen[2:6]] == [(c, "length", "") for c in range(4)]
        assert seen[-1] == Done(prompt_tokens=8, completion_tokens=0)
        # the two choices of a prompt share their memory length: read together, apart from the other prompt's
        assert engine.stats() == {"running": 0, "waiting": 0, "sessions": 0, "peak_batch": 2, "cancelled": 0}
    finally:
        engine.stop()


def test_a_stop_string_ends_a_choice_with_its_text_cut(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec).start()
    try:
        prompt = [3, 1, 4]
        free = model.generate(prompt, max_new_tokens=8, do_sample=True, seed=5).new_tokens[0].tolist()
        words = codec.decode(free).split()
        at = next(i for i in range(1, 8) if words[i] not in " ".join(words[:i]))  # a word not seen before
        _, seen = _collect(_run(engine, prompts=[prompt], max_tokens=8, seed=5, stop=[words[at]])[0])
        assert [e.token_id for e in seen if isinstance(e, Token)] == free[:at + 1]
        assert seen[-2] == Finish(0, "stop", seen[-2].text) and seen[-1].completion_tokens == at + 1
        assert "".join(e.text for e in seen if isinstance(e, (Token, Finish))) == " " + " ".join(words[:at]) + " "
        # the last word could begin a stop string: held back, it comes with the finish
        _, seen = _collect(_run(engine, prompts=[prompt], max_tokens=8, seed=5, stop=[f"{words[-1]} zz"])[0])
        assert seen[-2] == Finish(0, "length", words[-1])
        assert "".join(e.text for e in seen if isinstance(e, (Token, Finish))) == " " + " ".join(words)
    finally:
        engine.stop()


def test_waiting_requests_join_while_the_batch_has_room(parts) -> None:
    """Queued in order: a request joins the running ones when its rows fit ``max_batch`` exactly, and waits when
    they would not."""
    model, codec = parts
    engine = Engine(model, codec, max_batch=3)  # not started: all four are queued when it begins
    log: list[tuple[str, object]] = []
    greedy = Sampling(temperature=0)
    jobs = {name: Job(prompts=[[1 + i]], n=n, max_tokens=tokens, sampling=greedy,
                      emit=lambda ev, name=name: log.append((name, ev)))
            for i, (name, n, tokens) in enumerate([("a", 1, 8), ("b", 2, 3), ("c", 2, 3), ("d", 1, 3)])}
    for job in jobs.values():
        engine.submit(job)
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while sum(isinstance(ev, Done) for _, ev in log) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.stop()

    def first(name: str, kind: type) -> int:
        return next(i for i, (n, ev) in enumerate(log) if n == name and isinstance(ev, kind))

    second_of_a = [i for i, (n, ev) in enumerate(log) if n == "a" and isinstance(ev, Token)][1]
    assert first("b", Token) < second_of_a  # 1 + 2 rows = max_batch: b ran beside a
    assert first("c", Token) > first("b", Done)  # 3 + 2 > 3: c waited for b to leave
    assert first("c", Token) < first("a", Done)  # 1 + 2 rows: c ran beside a
    assert first("c", Done) < first("d", Token) < first("a", Done)  # a and c filled the batch; d took c's place
    assert first("a", Done) < first("d", Done)  # a request is done at the step of its last token


def test_stopping_fails_the_running_and_the_waiting_requests_and_ends_the_thread(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, max_batch=3).start()
    named = [t for t in threading.enumerate() if t.name == "txl-serve-engine"]
    try:
        running = [_run(engine, prompts=[[1]], n=n, max_tokens=100000)[0] for n in (2, 1)]
        for events in running:
            assert isinstance(events.get(timeout=60), Token)
        waiting, _ = _run(engine, prompts=[[2]], max_tokens=2)
    finally:
        engine.stop()
    assert len(named) == 1 and named[0].daemon  # a daemon: it never holds up the interpreter's exit
    assert not named[0].is_alive()
    for events in (*running, waiting):
        _, seen = _collect(events)
        assert seen[-1] == Failed("the server is stopping")
        assert events.empty()  # once for the request, not once per row


def test_the_memory_and_clamp_lengths_given_are_the_ones_read_with(parts) -> None:
    model, codec = parts
    engine = Engine(model, codec, mem_len=4, clamp_len=2).start()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    try:
        _, seen = _collect(_run(engine, prompts=[prompt], max_tokens=6, sampling=Sampling(temperature=0))[0])
    finally:
        engine.stop()
    log_probs = [e.log_prob for e in seen if isinstance(e, Token)]
    expected = model.generate(prompt, max_new_tokens=6, mem_len=4, clamp_len=2).log_probs[0].tolist()
    assert log_probs == pytest.approx(expected, abs=1e-5)
    for other in (dict(mem_len=4), dict(clamp_len=2)):  # each length changes what the model says here
        assert model.generate(prompt, max_new_tokens=6, **other).log_probs[0].tolist() != pytest.approx(expected,
                                                                                                       abs=1e-5)


def test_batch_and_queue_bounds_are_checked_and_default_to_8_and_256(parts) -> None:
    from transformer_xl.errors import ConfigError

    model, codec = parts
    for name in ("max_batch", "max_queue"):
        with pytest.raises(ConfigError, match=f"^{name} must be"):
            Engine(model, codec, **{name: 0})
    engine = Engine(model, codec, max_batch=1, max_queue=1)  # the least of each is allowed
    engine.submit(Job(prompts=[[1]], emit=print))
    with pytest.raises(RequestError, match="sessions are off"):  # the store given is the one used
        Engine(model, codec, sessions=SessionStore(0)).submit(Job(prompts=[[1]], session="s", emit=print))
    engine = Engine(model, codec)
    assert engine.stats() == {"running": 0, "waiting": 0, "sessions": 0, "peak_batch": 0, "cancelled": 0}
    with pytest.raises(RequestError, match=r"^the request needs 9 rows but the server batches at most 8 "
                                           r"\(--max-batch\)$") as info:
        engine.submit(Job(prompts=[[1]], n=9, emit=print))
    assert (info.value.status, info.value.param) == (400, "n")
    for _ in range(256):
        engine.submit(Job(prompts=[[1], [2]], n=4, emit=print))  # 8 rows: as many as fit
    with pytest.raises(RequestError, match=r"^the server is busy \(request queue full\), try again$") as info:
        engine.submit(Job(prompts=[[1]], emit=print))
    assert info.value.body()["error"] == {"message": str(info.value), "type": "server_error", "param": None,
                                          "code": "queue_full"}
    assert info.value.status == 503 and engine.stats()["waiting"] == 256


def test_a_session_keeps_its_memory_pending_id_tail_and_count_and_a_cancelled_turn_changes_nothing(parts) -> None:
    from transformer_xl.serve.sessions import TAIL

    model, codec = parts
    engine = Engine(model, codec, sessions=SessionStore(4), mem_len=64).start()
    greedy = Sampling(temperature=0)
    try:
        first, _ = _collect(_run(engine, prompts=[[5, 6, 7]], max_tokens=4, sampling=greedy, session="s")[0])
        text = [5, 6, 7, *first[0]]
        _, seen = _collect(_run(engine, prompts=[[8]], max_tokens=2, session="s", cancelled=True)[0])
        assert seen == [Failed("cancelled")] and engine.stats()["cancelled"] == 1  # its client left while it waited
        events, job = _run(engine, prompts=[[8]], max_tokens=100000, session="s")
        assert isinstance(events.get(timeout=60), Token)
        job.cancelled = True  # its client left while it ran
        assert _collect(events)[1][-1] == Failed("cancelled") and engine.stats()["cancelled"] == 2
        _, seen = _collect(_run(engine, prompts=[[8, 9]], max_tokens=0, session="s")[0])  # reads, chooses nothing
        text += [8, 9]
        state = engine.sessions.acquire("s")
        engine.sessions.release("s", None)
        assert (state.pending, state.tail, state.tokens) == ([], text[-TAIL:], len(text))
        expected = model.generate(text, max_new_tokens=1, mem_len=64)
        assert torch.equal(state.mems[0], expected.mems[0][:, :len(text)])
        last, seen = _collect(_run(engine, prompts=[[10, 11]], max_tokens=3, sampling=greedy, session="s")[0])
        whole = model.generate([*text, 10, 11], max_new_tokens=3, mem_len=64)
        assert last[0] == whole.new_tokens[0].tolist()
        state = engine.sessions.acquire("s")
        assert (state.pending, state.tokens) == ([last[0][-1]], len(text) + 2 + 2)  # the last id is not read yet
        assert state.tail == [*text, 10, 11, *last[0]][-TAIL:]
    finally:
        engine.stop()


def test_a_scored_prompt_holds_no_table_of_the_whole_prompt() -> None:
    """Echo with log-probabilities over a prompt of 12 segments: when its scores are sent and when its first token is
    chosen, no tensor of the log-probabilities of more than two segments is alive (the old engine held the prompt's
    whole ``[T, V]`` table, and its rows a view of it); every scored position carries its top ids."""
    import gc

    v = 37  # a vocabulary size no other tensor of the tests has as its last dimension
    model = generation_model(n_token=v, mem_len=8)  # tgt_len 5
    codec = TextCodec(Vocab([f"w{i}" for i in range(v)]), "word")
    prompt = [(3 * i + 1) % v for i in range(60)]
    events: queue.Queue = queue.Queue()
    big: dict[str, list[tuple[int, ...]]] = {}

    def emit(ev: object) -> None:  # on the engine thread, between its steps
        name = type(ev).__name__
        if name in ("PromptScores", "Token") and name not in big:
            big[name] = [tuple(t.shape) for t in gc.get_objects() if issubclass(type(t), torch.Tensor) and t.dim()
                         and t.size(-1) == v and t.untyped_storage().nbytes() > 2 * 5 * v * 4]
        events.put(ev)

    engine = Engine(model, codec).start()
    try:
        engine.submit(Job(prompts=[prompt], emit=emit, max_tokens=3, sampling=Sampling(temperature=0),
                          score_prompt=True, top_logprobs=2))
        _, seen = _collect(events)
    finally:
        engine.stop()
    assert big == {"PromptScores": [], "Token": []}
    scores = next(e for e in seen if isinstance(e, PromptScores))
    assert scores.top[0] is None and len(scores.top) == len(prompt)
    table = advance(model, [prompt], every_position=True)[0][0]
    for t in range(1, len(prompt)):  # the two likeliest ids after prompt[:t], most likely first
        values, ids = table[t - 1].topk(2)
        assert [i for i, _ in scores.top[t]] == ids.tolist()
        assert [x for _, x in scores.top[t]] == pytest.approx(values.tolist(), abs=1e-6)
        assert scores.log_probs[t] == pytest.approx(float(table[t - 1, prompt[t]]), abs=1e-6)


def test_one_samples_stop_string_ends_that_sample_only(parts) -> None:
    """Three samples of one prompt (one seeded generator, drawn in row order): the stop string the first one writes
    at its token k (a word no other word contains) ends it there with "stop"; the others drew exactly what they drew
    without stops up to that step and go on, each to its own finish; the request is done when the last one is."""
    model, codec = parts
    engine = Engine(model, codec).start()
    kw = dict(prompts=[[3, 1, 4]], n=3, max_tokens=12, seed=7)
    try:
        free, _ = _collect(_run(engine, **kw)[0])

        def text(c: int, j: int) -> str:
            return codec.decode(free[c][:j])

        k, stop = next((k, w) for k in range(1, 10) for w in [codec.decode(free[0][k:k + 1])]  # w4..w39: no other
                       if int(w[1:]) >= 4 and w not in text(0, k) and all(w not in text(c, k + 1) for c in (1, 2)))
        tokens, seen = _collect(_run(engine, stop=[stop], **kw)[0])
    finally:
        engine.stop()
    assert tokens[0] == free[0][:k + 1]
    finishes = {e.choice: e for e in seen if isinstance(e, Finish)}
    assert sorted(finishes) == [0, 1, 2] and len([e for e in seen if isinstance(e, Finish)]) == 3
    assert finishes[0].reason == "stop"
    for c in (1, 2):
        assert tokens[c][:k + 1] == free[c][:k + 1] and len(tokens[c]) > k + 1
        assert finishes[c].reason == ("length" if len(tokens[c]) == 12 else "stop")
    assert any(len(tokens[c]) == 12 for c in (1, 2))  # (seed 7: both run to max_tokens)
    assert seen[-1] == Done(prompt_tokens=3, completion_tokens=sum(map(len, tokens.values())))
    assert all(not isinstance(e, Done) for e in seen[:-1])


def test_a_request_cancelled_while_it_waits_leaves_the_queue_though_the_batch_is_full(parts) -> None:
    """One row, held by a long request: the waiting request whose client went away (``Engine.cancel``) ends at once,
    not when a row frees; its session can be named again (no 409) and its queue place taken (``max_queue`` 1: no
    503)."""
    model, codec = parts
    engine = Engine(model, codec, max_batch=1, max_queue=1, sessions=SessionStore(4)).start()
    try:
        running, long = _run(engine, prompts=[[1, 2]], max_tokens=10 ** 6, sampling=Sampling(temperature=0))
        assert isinstance(running.get(timeout=60), Token)
        waiting, job = _run(engine, prompts=[[3]], max_tokens=2, session="s")
        assert engine.stats()["waiting"] == 1
        engine.cancel(job)
        assert waiting.get(timeout=5) == Failed("cancelled")  # the old engine: only once the long request ended
        assert engine.stats()["waiting"] == 0 and engine.stats()["cancelled"] == 1
        again, _ = _run(engine, prompts=[[3]], max_tokens=2, session="s")  # the session and the queue place: free
        engine.cancel(long)
        assert _collect(again)[1][-1] == Done(1, 2) and _collect(running)[1][-1] == Failed("cancelled")
        assert engine.stats()["cancelled"] == 2
    finally:
        engine.stop()


def test_the_idle_memory_release_does_not_hold_up_submit(parts, monkeypatch) -> None:
    """When the engine goes idle it gives freed memory back (``malloc_trim``, which may take a while) without holding
    the lock ``submit`` takes: a request submitted meanwhile is queued at once, and runs."""
    model, codec = parts
    engine = Engine(model, codec)
    later: queue.Queue = queue.Queue()
    queued: list[bool] = []

    def release() -> bool:  # on the engine thread, when it went idle
        if not queued:
            submit = threading.Thread(target=engine.submit, args=(Job(prompts=[[4]], emit=later.put, max_tokens=1),))
            submit.start()
            submit.join(timeout=2)
            queued.append(not submit.is_alive())
        return True

    monkeypatch.setattr("transformer_xl.serve.engine.release_free_memory", release)
    engine.start()
    try:
        assert _collect(_run(engine, prompts=[[1]], max_tokens=1)[0])[1][-1] == Done(1, 1)
        assert _collect(later)[1][-1] == Done(1, 1)
    finally:
        engine.stop()
    assert queued == [True]
