"""Requests to responses: prompt ids checked against the vocabulary, echo and log-probabilities, the streamed form."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from transformer_xl.serve.protocol import RequestError

openai = pytest.importorskip("openai")


def test_prompt_ids_are_checked(served) -> None:
    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import Limits

    comp = Completions(served.engine, served.codec, "tiny", Limits(max_prompt_tokens=3))
    assert comp.prompt_ids("the cat") == served.codec.encode("the cat")
    assert comp.prompt_ids("zebra") == [served.codec.vocab.unk_idx]  # unknown words become <unk>
    assert comp.prompt_ids("the cat sat") == served.codec.encode("the cat sat")  # the limit itself is allowed
    n_token = len(served.codec.vocab)
    assert comp.prompt_ids([0, n_token - 1, 5]) == [0, n_token - 1, 5]  # the first and the last id
    for ids in ([0, n_token], [-1, 2]):
        with pytest.raises(RequestError) as info:
            comp.prompt_ids(ids)
        assert info.value.body() == {"error": {"message": f"prompt token ids must lie in [0, {n_token})",
                                               "type": "invalid_request_error", "param": "prompt",
                                               "code": "invalid_value"}}
    for prompt in ("the cat sat on", [2, 3, 4, 5]):
        with pytest.raises(RequestError) as info:
            comp.prompt_ids(prompt)
        assert info.value.body() == {"error": {"message": "the prompt has 4 tokens; this server reads at most 3 per "
                                               "prompt", "type": "invalid_request_error", "param": "prompt",
                                               "code": "context_length_exceeded"}}
        assert info.value.status == 400


def test_refusals_through_http_are_the_protocols_error_objects(served) -> None:
    n_token = len(served.codec.vocab)
    assert _post(served, {"prompt": [0, n_token - 1], "max_tokens": 1})[0] == 200
    status, raw = _post(served, {"prompt": [-1, 2]})
    assert (status, json.loads(raw)) == (400, {"error": {"message": f"prompt token ids must lie in [0, {n_token})",
                                                         "type": "invalid_request_error", "param": "prompt",
                                                         "code": "invalid_value"}})
    status, raw = _post(served, {"prompt": "the", "model": "gpt-4"})
    assert (status, json.loads(raw)) == (404, {"error": {
        "message": "the model 'gpt-4' does not exist; this server holds 'tiny'", "type": "invalid_request_error",
        "param": "model", "code": "model_not_found"}})
    assert _post(served, {"prompt": "the", "model": "tiny", "max_tokens": 1})[0] == 200


def test_token_id_prompts_equal_text_prompts(served) -> None:
    client = served.client()
    ids = served.codec.encode("the cat sat")
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_streamed_logprobs_and_echo_equal_the_whole_response(served) -> None:
    client = served.client()
    kw = dict(model="tiny", prompt="a big dog", max_tokens=6, temperature=0, echo=True, logprobs=2)
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    streamed = [lp for c in chunks if c.logprobs for lp in c.logprobs.token_logprobs]
    assert streamed == whole.logprobs.token_logprobs and len(streamed) == 3 + 6
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert offsets == whole.logprobs.text_offset
    for offset, token in zip(whole.logprobs.text_offset, whole.logprobs.tokens):
        assert whole.text[offset:].lstrip().startswith(token)


def test_max_tokens_zero_with_echo_scores_the_prompt(served) -> None:
    out = served.client().completions.create(model="tiny", prompt="the cat sat", max_tokens=0, echo=True, logprobs=0)
    choice = out.choices[0]
    assert choice.text == "the cat sat" and choice.logprobs.tokens == ["the", "cat", "sat"]
    assert choice.logprobs.token_logprobs[0] is None and all(lp < 0 for lp in choice.logprobs.token_logprobs[1:])
    assert out.usage.completion_tokens == 0


# ---------------------------------------------------------------------------------------------- the raw HTTP side
def _alike(a: dict, b: dict) -> None:
    """Two greedy choices of one prompt: the same text, tokens and offsets; log-probabilities to float rounding (the
    rows of one batch: on AVX2 and AMX kernels a row's product depends on where it sits in the batch, by a unit in
    the last place)."""
    assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"]
    if a["logprobs"] is None or b["logprobs"] is None:
        assert a["logprobs"] is b["logprobs"] is None
        return
    la, lb = a["logprobs"], b["logprobs"]
    assert la["tokens"] == lb["tokens"] and la["text_offset"] == lb["text_offset"]
    assert [x is None for x in la["token_logprobs"]] == [x is None for x in lb["token_logprobs"]]
    assert [x for x in la["token_logprobs"] if x is not None] == pytest.approx(
        [x for x in lb["token_logprobs"] if x is not None], rel=1e-6, abs=1e-6)
    for ta, tb in zip(la["top_logprobs"], lb["top_logprobs"], strict=True):
        assert (ta is None and tb is None) or (ta.keys() == tb.keys() and ta == pytest.approx(tb, rel=1e-6, abs=1e-6))


def _post(served, body: dict, timeout: float = 60) -> tuple[int, bytes]:
    """``POST /v1/completions`` with ``body``: the status and the raw bytes of the response."""
    req = urllib.request.Request(served.url + "/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _events(raw: bytes) -> list[dict]:
    """The decoded ``data:`` events of a stream, which must end with ``data: [DONE]``."""
    parts = raw.decode().split("\n\n")
    assert parts[-2:] == ["data: [DONE]", ""], parts[-3:]
    assert all(p.startswith("data: {") for p in parts[:-2]), parts
    return [json.loads(p.removeprefix("data: ")) for p in parts[:-2]]


CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason"}
LOGPROB_KEYS = ["tokens", "token_logprobs", "top_logprobs", "text_offset"]


def _check_envelope(doc: dict, started: float, keys: set[str]) -> None:
    assert set(doc) == keys and doc["object"] == "text_completion" and doc["model"] == "tiny"
    assert doc["id"].startswith("cmpl-") and len(doc["id"]) == 5 + 32
    assert type(doc["created"]) is int and int(started) <= doc["created"] <= time.time()
    assert all(set(c) == CHOICE_KEYS for c in doc["choices"])


def _merge(chunks: list[dict]) -> dict[int, dict]:
    """Every choice of a stream rebuilt from its deltas (text, log-probabilities, finish reason)."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for d in chunk["choices"]:
            assert d["text"] or d["logprobs"] or d["finish_reason"], "an empty delta was sent"
            c = out.setdefault(d["index"], {"text": "", "logprobs": None, "finish_reason": None})
            assert c["finish_reason"] is None, "a delta after the choice's finish reason"
            c["text"] += d["text"]
            c["finish_reason"] = d["finish_reason"]
            if d["logprobs"] is not None:
                c["logprobs"] = c["logprobs"] or {k: [] for k in LOGPROB_KEYS}
                for k in LOGPROB_KEYS:
                    c["logprobs"][k] += d["logprobs"][k]
    return out


@pytest.mark.parametrize("extra", [{}, {"echo": True}, {"logprobs": 0}, {"logprobs": 1}, {"echo": True, "logprobs": 2},
                                   {"stream_options": {"include_usage": True}},
                                   {"echo": True, "stream_options": {"include_usage": True}}])
def test_the_streamed_events_rebuild_the_whole_response(served, extra) -> None:
    """Two prompts (text, and token ids) x n=2, greedy: the whole object in full, and the server-sent events whose
    deltas add up to it, ``data: [DONE]`` last, usage only when asked for."""
    ids = served.codec.encode("a big dog")
    body = {"model": "tiny", "prompt": ["the cat", ids], "n": 2, "max_tokens": 4, "temperature": 0, **extra}
    started = time.time()
    status, raw = _post(served, body)
    assert status == 200, raw
    whole = json.loads(raw)
    _check_envelope(whole, started, {"id", "object", "created", "model", "choices", "usage"})
    assert whole["usage"] == {"prompt_tokens": 2 + 3, "completion_tokens": 4 * 4, "total_tokens": 2 + 3 + 16}
    choices = whole["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3] and all(c["finish_reason"] == "length" for c in choices)
    for a, b in ((choices[0], choices[1]), (choices[2], choices[3])):  # greedy: n alike
        _alike(a, b)
    echo, logprobs = extra.get("echo", False), extra.get("logprobs")
    for c, prompt, prompt_ids in ((choices[0], "the cat", served.codec.encode("the cat")),
                                  (choices[2], "a big dog", ids)):
        assert c["text"].startswith(prompt) == echo
        if logprobs is None:
            assert c["logprobs"] is None
            continue
        lp = c["logprobs"]
        assert list(lp) == LOGPROB_KEYS and len({len(v) for v in lp.values()}) == 1
        scored = len(prompt_ids) if echo else 0
        assert len(lp["tokens"]) == scored + 4 and lp["tokens"][:scored] == prompt.split()[:scored]
        first = 1 if echo else 0  # the first prompt token has no score and no alternatives
        assert lp["token_logprobs"][:first] == [None] * first and all(x < 0 for x in lp["token_logprobs"][first:])
        assert lp["top_logprobs"][:first] == [None] * first
        for x, top in zip(lp["token_logprobs"][first:scored], lp["top_logprobs"][first:scored]):
            assert len(top) == logprobs and (not top or x <= max(top.values()))  # the prompt's: its alternatives too
        for token, x, top in zip(lp["tokens"][scored:], lp["token_logprobs"][scored:], lp["top_logprobs"][scored:]):
            assert len(top) == logprobs and (not top or top[token] == x == max(top.values()))  # greedy: the top one
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
        for offset, token in zip(lp["text_offset"], lp["tokens"]):
            assert c["text"][offset:].lstrip().startswith(token)

    started = time.time()
    status, raw = _post(served, {**body, "stream": True})
    assert status == 200
    chunks = _events(raw)
    usage = extra.get("stream_options", {}).get("include_usage", False)
    for chunk in chunks[:-1] if usage else chunks:
        _check_envelope(chunk, started, {"id", "object", "created", "model", "choices"})
        assert chunk["choices"] and chunk["id"] == chunks[0]["id"] and chunk["created"] == chunks[0]["created"]
    if usage:
        _check_envelope(chunks[-1], started, {"id", "object", "created", "model", "choices", "usage"})
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
        assert chunks[-1]["id"] == chunks[0]["id"]
    if echo and logprobs is None:  # the prompts first, as they were given, every choice in one chunk
        assert chunks[0]["choices"] == [{"index": i, "text": ["the cat", "a big dog"][i // 2], "logprobs": None,
                                         "finish_reason": None} for i in range(4)]
    if echo and logprobs is not None:  # a prompt's scored tokens first, for its own choices only
        first = [[d["index"] for d in ch["choices"]] for ch in chunks if any(d["logprobs"] and d["logprobs"][
            "token_logprobs"][:1] == [None] for d in ch["choices"])]
        assert sorted(first) == [[0, 1], [2, 3]]
    merged = _merge(chunks)
    assert [merged[i] for i in range(4)] == [{k: c[k] for k in ("text", "logprobs", "finish_reason")}
                                              for c in choices] and len(merged) == 4


def test_a_stream_cut_by_a_stop_string_sends_no_empty_deltas(served) -> None:
    """Text that could begin a stop string is held back (its tokens make no text): no delta is sent for it."""
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": 8, "temperature": 0}
    plain = json.loads(_post(served, body)[1])["choices"][0]["text"]
    stop = " ".join(plain.split()[:3])  # three words: held back until the third completes them
    body["stop"] = [stop]
    whole = json.loads(_post(served, body)[1])["choices"][0]
    assert whole["finish_reason"] == "stop" and whole["text"] == plain[:plain.index(stop)]
    chunks = _events(_post(served, {**body, "stream": True})[1])
    assert _merge(chunks) == {0: {"text": whole["text"], "logprobs": None, "finish_reason": "stop"}}
    assert len(chunks) <= 2  # the text before the stop string, if any, and the finish reason


def test_each_sampling_option_reaches_the_draw(served) -> None:
    """At temperature 1.5 a seeded draw leaves the greedy text; top_k=1, a tiny top_p, or min_p=1 keep only the most
    likely token, so each alone brings the greedy text back."""
    client = served.client()
    kw = dict(model="tiny", prompt="the cat", max_tokens=12)
    greedy = client.completions.create(temperature=0, **kw).choices[0].text
    assert client.completions.create(temperature=1.5, seed=1, **kw).choices[0].text != greedy
    for option in ({"top_k": 1}, {"top_p": 1e-3}, {"min_p": 1.0}):
        out = client.completions.create(temperature=1.5, seed=1, extra_body=option, **kw)
        assert out.choices[0].text == greedy, option


def _txl_generate(capsys, model_dir, prompt: str, n: int, *options: str) -> str:
    from transformer_xl.cli import main

    assert main(["generate", str(model_dir), "--prompt", prompt, "--max-new-tokens", str(n), "--greedy", "--json",
                 *options]) == 0
    return json.loads(capsys.readouterr().out)["samples"][0]["text"]


@pytest.mark.parametrize("option, flag", [({"repetition_penalty": 3.0}, "--repetition-penalty=3"),
                                          ({"no_repeat_ngram_size": 2}, "--no-repeat-ngram-size=2")])
def test_penalties_equal_txl_generate_with_them(served, capsys, option, flag) -> None:
    """Greedy text with a penalty is the text ``txl generate`` writes with it (and not the text without it)."""
    client = served.client()
    out = client.completions.create(model="tiny", prompt="a big dog", max_tokens=10, temperature=0, extra_body=option)
    assert out.choices[0].text == _txl_generate(capsys, served.model_dir, "a big dog", 10, flag)
    assert out.choices[0].text != _txl_generate(capsys, served.model_dir, "a big dog", 10)


def test_a_whole_completion_ends_when_its_client_goes_away(served, monkeypatch) -> None:
    """The client is asked about once a second while the job runs (it sends events without pause, so not only after
    a quiet second), and no more often; its job is cancelled, and the engine drops the events it sends after the
    request's loop has closed."""
    import asyncio

    from transformer_xl.serve.completions import POLL, Completions
    from transformer_xl.serve.engine import Done
    from transformer_xl.serve.protocol import Limits, parse_completion

    limits = Limits(max_tokens=10 ** 6)  # runs until the client goes away
    comp = Completions(served.engine, served.codec, "tiny", limits)
    jobs: list = []
    submit = served.engine.submit
    monkeypatch.setattr(served.engine, "submit", lambda job: (jobs.append(job), submit(job))[1])
    before = served.engine.stats()["cancelled"]
    polls: list[float] = []

    async def disconnected() -> bool:
        polls.append(time.monotonic())
        return len(polls) == 2  # gone at the second check

    async def whole() -> RequestError:
        with pytest.raises(RequestError) as info:
            await asyncio.wait_for(comp.complete(parse_completion({"prompt": "the", "max_tokens": 10 ** 6}, limits),
                                                 disconnected), timeout=15)
        return info.value

    start = time.monotonic()
    err = asyncio.run(whole())
    assert (err.status, str(err), len(polls)) == (499, "the client went away", 2)
    assert polls[0] - start >= POLL and polls[1] - polls[0] >= POLL
    deadline = time.monotonic() + 30
    while served.engine.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.engine.stats()["cancelled"] == before + 1
    jobs[0].emit(Done(1, 0))  # as the engine does after the loop has closed: nobody listens, nothing raises
    out = served.client(timeout=30).completions.create(model="tiny", prompt="the", max_tokens=2)
    assert out.usage.completion_tokens == 2  # the engine thread lives on


def test_waiting_and_running_completions_end_with_the_server(tmp_path) -> None:
    """With one row: a stream runs; a whole completion waits in the queue, and ends after a quiet second when its
    client has gone, or waits on through quiet seconds while it is there; when the server stops, the stream ends with
    the protocol's error event and the waiting completion with a 500."""
    import asyncio
    import threading

    from tests.serve.conftest import save_served_model, start_server
    from transformer_xl.serve.completions import POLL, Completions
    from transformer_xl.serve.protocol import Limits, parse_completion

    gen = start_server(save_served_model(tmp_path), max_batch=1, limits=Limits(max_tokens=10 ** 6))
    served = next(gen)
    long = {"prompt": "the", "max_tokens": 10 ** 6, "temperature": 0}
    got: dict = {}

    def wait_for(key: str, count: int) -> None:
        deadline = time.monotonic() + 30
        while served.engine.stats()[key] < count and time.monotonic() < deadline:
            time.sleep(0.01)

    async def gone() -> bool:
        return True

    async def whole_gone() -> RequestError:  # waits in the queue: asked about after a quiet second
        with pytest.raises(RequestError) as info:
            await asyncio.wait_for(comp.complete(parse_completion(long, limits), gone), timeout=15)
        return info.value

    limits = Limits(max_tokens=10 ** 6)
    threads = [threading.Thread(target=lambda: got.setdefault("stream", _post(served, {**long, "stream": True}))),
               threading.Thread(target=lambda: got.setdefault("whole", _post(served, long)))]
    try:
        threads[0].start()
        wait_for("running", 1)
        comp = Completions(served.engine, served.codec, "tiny", limits)
        start = time.monotonic()
        err = asyncio.run(whole_gone())
        assert (err.status, str(err)) == (499, "the client went away") and time.monotonic() - start >= POLL
        threads[1].start()
        wait_for("waiting", 1)
        time.sleep(1.5)  # past the waiting request's first quiet second
        served.engine.stop()
        for t in threads:
            t.join(timeout=30)
    finally:
        gen.close()
    error = {"error": {"message": "the completion failed: the server is stopping", "type": "server_error",
                       "param": None, "code": None}}
    assert (got["whole"][0], json.loads(got["whole"][1])) == (500, error)
    status, raw = got["stream"]
    chunks = _events(raw)
    assert status == 200 and chunks[-1] == error and all("error" not in c for c in chunks[:-1]) and len(chunks) > 1


def _request(served, body: dict) -> bytes:
    """The raw bytes of ``POST /v1/completions`` with ``body``."""
    data = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def test_a_completion_whose_client_leaves_while_it_waits_frees_its_session_at_once(tmp_path) -> None:
    """One row, held by a stream; a whole completion naming a session waits behind it, and its client goes away: it
    leaves the queue (after a quiet poll) though the stream still holds the row, so a retry naming the session waits
    in its turn instead of being refused with 409 (session busy). The old engine kept it queued until a row freed."""
    from tests.serve.conftest import read_status, save_served_model, start_server
    from transformer_xl.serve.protocol import Limits

    gen = start_server(save_served_model(tmp_path), max_batch=1, limits=Limits(max_tokens=10 ** 6))
    served = next(gen)
    stats = served.engine.stats

    def until(check) -> bool:
        deadline = time.monotonic() + 5
        while not check() and time.monotonic() < deadline:
            time.sleep(0.01)
        return check()

    turn = {"prompt": "the", "max_tokens": 2, "session": "s"}
    try:
        stream = served.raw(_request(served, {"prompt": "the", "max_tokens": 10 ** 6, "stream": True}))
        assert until(lambda: stats()["running"] == 1)
        waiting = served.raw(_request(served, turn))
        assert until(lambda: stats()["waiting"] == 1)
        waiting.close()
        assert until(lambda: stats()["waiting"] == 0) and stats()["cancelled"] == 1
        retry = served.raw(_request(served, turn))
        assert until(lambda: stats()["waiting"] == 1)  # queued behind the stream, not refused
        assert read_status(retry, 0.3)[0] == 0  # no answer yet
        stream.close()
    finally:
        gen.close()


def test_a_streamed_echo_with_logprobs_makes_each_prompts_texts_once(served, monkeypatch) -> None:
    """Echo with log-probabilities, streamed, of P prompts x n choices of L tokens, k alternatives: each prompt's
    scores echo that prompt's n choices only (the old server echoed every prompt again for each prompt: P * P * n),
    and its ``top_logprobs`` texts are made once for its n choices (the old: n times), so P * (n * L + (L - 1) * k)
    token texts are made in all; the stream adds up to the whole response."""
    from transformer_xl.serve.completions import Completions

    made: list[int] = []
    token_text = Completions.token_text
    monkeypatch.setattr(Completions, "token_text", lambda self, i: (made.append(i), token_text(self, i))[1])
    body = {"model": "tiny", "prompt": ["the cat sat", "a big dog", "the dog ran", "a red mat"], "n": 2,
            "max_tokens": 0, "echo": True, "logprobs": 2}
    whole = json.loads(_post(served, body)[1])["choices"]
    made.clear()
    chunks = _events(_post(served, {**body, "stream": True})[1])
    assert len(made) == 4 * (2 * 3 + (3 - 1) * 2)
    merged = _merge(chunks)
    assert [merged[i] for i in range(8)] == [{k: c[k] for k in ("text", "logprobs", "finish_reason")} for c in whole]


# ---------------------------------------------------------------------------------------------- echoed prompt scores
def test_lm_evaluation_harness_reads_an_echoed_prompts_scores_and_greediness(served) -> None:
    """lm-evaluation-harness's ``local-completions`` loglikelihood request (context + continuation ids, echo,
    logprobs 1, max_tokens 1), read by its own parser: the continuation's log-probability is the model's, and it is
    "greedy" exactly when every continuation token was the most likely one (it takes ``max`` of each position's
    ``top_logprobs``, which must be there for every prompt token after the first)."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from transformer_xl.inference.generate import advance

    context = served.codec.encode("the cat sat on")
    greedy = served.model.generate(context, max_new_tokens=3).new_tokens[0].tolist()
    other = [greedy[0], (greedy[1] + 1) % len(served.codec.vocab), greedy[2]]
    for continuation, is_greedy in ((greedy, True), (other, False)):
        ids = context + continuation
        status, raw = _post(served, {"model": "tiny", "prompt": ids, "temperature": 0, "max_tokens": 1, "logprobs": 1,
                                     "seed": 1234, "echo": True})
        assert status == 200, raw
        doc = json.loads(raw)
        assert doc["choices"][0]["logprobs"]["top_logprobs"][0] is None  # the first token: no score, no alternatives
        [(logprob, greedy_read)] = LocalCompletionsAPI.parse_logprobs(outputs=doc, tokens=[ids],
                                                                       ctxlens=[len(context)])
        table = advance(served.model, [ids], every_position=True)[0][0]  # [T, V]: position t predicts id t + 1
        expected = sum(float(table[t - 1, ids[t]]) for t in range(len(context), len(ids)))
        assert (logprob, greedy_read) == (pytest.approx(expected, abs=1e-5), is_greedy)


# ---------------------------------------------------------------------------------------------- n choices, stops
def _words(served, prompt: str, n: int = 6) -> str:
    """The greedy text of ``prompt`` with no word twice (so that each word is a stop string found once)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "no_repeat_ngram_size": 1}
    return json.loads(_post(served, body)[1])["choices"][0]["text"]


def test_each_of_n_choices_ends_at_its_own_stop_whole_and_streamed(served) -> None:
    """Two prompts x n=2: a stop string that only the first prompt's text holds ends its two choices ("stop", cut
    there); the second prompt's two run to max_tokens ("length", whole); every choice comes back, in index order,
    with its finish reason, in the whole response and rebuilt from the stream alike."""
    first, second = _words(served, "the cat"), _words(served, "one two")
    stop = next(w for w in first.split()[1:] if w not in second and w not in first[:first.index(w)])
    body = {"model": "tiny", "prompt": ["the cat", "one two"], "n": 2, "max_tokens": 6, "temperature": 0,
            "no_repeat_ngram_size": 1, "stop": [stop]}
    status, raw = _post(served, body)
    assert status == 200, raw
    choices = json.loads(raw)["choices"]
    cut = first[:first.index(stop)]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
        (0, cut, "stop"), (1, cut, "stop"), (2, second, "length"), (3, second, "length")]
    merged = _merge(_events(_post(served, {**body, "stream": True})[1]))
    assert merged == {c["index"]: {"text": c["text"], "logprobs": None, "finish_reason": c["finish_reason"]}
                      for c in choices}


def test_the_earliest_stop_in_the_text_cuts_whichever_was_listed_first(served) -> None:
    """``stop: [w3, "w2 w3"]``: both are completed by the token w3; the text is cut where "w2 w3" begins."""
    text = _words(served, "the cat")
    w1, w2, w3 = text.split()[:3]
    assert text.startswith(f" {w1} {w2} {w3}")
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": 6, "temperature": 0, "no_repeat_ngram_size": 1,
            "stop": [w3, f"{w2} {w3}"]}
    for form in ({}, {"stream": True}):
        raw = _post(served, {**body, **form})[1]
        choice = _merge(_events(raw))[0] if form else json.loads(raw)["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (f" {w1} ", "stop")


def test_a_stop_made_by_the_last_token_allowed_is_a_stop(served) -> None:
    """max_tokens 3: a stop string completed by the third token ends the choice with "stop"; one only begun there is
    held back until the end, then sent, with "length"."""
    text = _words(served, "the cat")
    w1, w2, w3 = text.split()[:3]
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": 3, "temperature": 0, "no_repeat_ngram_size": 1}
    for stop, want in ((w3, (f" {w1} {w2} ", "stop")), (f"{w3} zz", (f" {w1} {w2} {w3}", "length"))):
        for form in ({}, {"stream": True}):
            raw = _post(served, {**body, "stop": [stop], **form})[1]
            choice = _merge(_events(raw))[0] if form else json.loads(raw)["choices"][0]
            assert (choice["text"], choice["finish_reason"]) == want, (stop, form)


# ---------------------------------------------------------------------------------------------- encoding
def test_a_text_prompt_beyond_max_prompt_chars_is_refused_before_it_is_encoded(served) -> None:
    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import Limits

    error = {"error": {"message": "the prompt has 262145 characters; this server reads at most 262144 per prompt "
                                  "(--max-prompt-chars)", "type": "invalid_request_error", "param": "prompt",
                       "code": "context_length_exceeded"}}
    for form in ({}, {"stream": True}):  # a stream is refused before its first byte
        status, raw = _post(served, {"model": "tiny", "prompt": ["the", "x" * 262_145], **form})
        assert (status, json.loads(raw)) == (400, error), form
    assert _post(served, {"model": "tiny", "prompt": "the " * 65_536, "max_tokens": 1})[0] == 400  # tokens, then

    class Counting:
        """The served codec, counting what it is asked to encode."""

        def __init__(self) -> None:
            self.calls = 0

        def encode(self, text: str) -> list[int]:
            self.calls += 1
            return served.codec.encode(text)

        def __getattr__(self, name: str):
            return getattr(served.codec, name)

    codec = Counting()
    comp = Completions(served.engine, codec, "tiny", Limits(max_prompt_chars=7))
    assert comp.prompt_ids("the cat") == served.codec.encode("the cat") and codec.calls == 1  # the limit is allowed
    with pytest.raises(RequestError, match=r"^the prompt has 8 characters; this server reads at most 7 per prompt "
                                           r"\(--max-prompt-chars\)$"):
        comp.prompt_ids("the cats")
    assert codec.calls == 1


class _Blocking:
    """The served codec, whose ``encode`` waits (at most 5 s) until the test releases it."""

    def __init__(self, codec) -> None:
        import threading

        self.codec, self.entered, self.release = codec, threading.Event(), threading.Event()
        self.waited_out = False

    def encode(self, text: str) -> list[int]:
        self.entered.set()
        self.waited_out = not self.release.wait(5)
        return self.codec.encode(text)

    def __getattr__(self, name: str):
        return getattr(self.codec, name)


def test_prompts_are_encoded_off_the_event_loop(served) -> None:
    """While a prompt is being encoded, the event loop runs other coroutines: one of them is what lets the encoding
    finish (encoding on the loop would wait out the 5 s and be caught); a whole completion and a stream alike."""
    import asyncio

    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import parse_completion

    async def gone() -> bool:
        return False

    async def released_by_the_loop(codec: _Blocking) -> None:
        while not codec.entered.is_set():
            await asyncio.sleep(0.01)
        codec.release.set()  # runs on the loop while encode waits in its thread

    async def whole(comp: Completions, codec: _Blocking) -> dict:
        req = parse_completion({"prompt": "the cat", "max_tokens": 2, "temperature": 0})
        out, _ = await asyncio.gather(comp.complete(req, gone), released_by_the_loop(codec))
        return out

    async def streamed(comp: Completions, codec: _Blocking) -> list[str]:
        req = parse_completion({"prompt": "the cat", "max_tokens": 2, "temperature": 0, "stream": True})
        events, _ = await asyncio.gather(comp.stream(req), released_by_the_loop(codec))
        return [e async for e in events]

    for run in (whole, streamed):
        codec = _Blocking(served.codec)
        out = asyncio.run(asyncio.wait_for(run(Completions(served.engine, codec, "tiny"), codec), timeout=30))
        assert not codec.waited_out and out, run.__name__
    chunks = _events("".join(out).encode())
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_request_cancelled_while_its_prompt_is_encoded_is_never_queued(served, monkeypatch) -> None:
    """The server cancels a request whose client went away; while its prompt is being encoded (in a worker thread that
    goes on), its job is then never queued."""
    import asyncio

    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import Limits, parse_completion

    limits = Limits(max_tokens=10 ** 6)
    codec = _Blocking(served.codec)
    comp = Completions(served.engine, codec, "tiny", limits)
    jobs: list = []
    submit = served.engine.submit
    monkeypatch.setattr(served.engine, "submit", lambda job: (jobs.append(job), submit(job))[1])

    async def here() -> bool:
        return False

    async def main() -> None:
        req = parse_completion({"prompt": "the", "max_tokens": 10 ** 6}, limits)
        task = asyncio.ensure_future(comp.complete(req, here))
        while not codec.entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        codec.release.set()

    asyncio.run(main())  # its end waits for the worker thread
    assert not codec.waited_out and jobs == [] and served.engine.stats()["running"] == 0


# ---------------------------------------------------------------------------------------------- sessions
def test_session_reset_says_when_a_session_started_empty(served) -> None:
    """``session_reset``: true when the named session had no memory (new, or forgotten: dropped, evicted, expired),
    false when it continued; in the whole response and in the first chunk of a stream only; absent without a
    session."""
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": 2, "temperature": 0, "session": "reset-test"}

    def whole() -> object:
        doc = json.loads(_post(served, body)[1])
        return doc.get("session_reset", "absent")

    def streamed() -> list[object]:
        return [c.get("session_reset", "absent") for c in _events(_post(served, {**body, "stream": True})[1])]

    assert whole() is True  # new
    assert whole() is False
    first, *rest = streamed()
    assert first is False and rest and set(rest) == {"absent"}
    req = urllib.request.Request(served.url + "/sessions/reset-test", method="DELETE")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    assert streamed()[0] is True and whole() is False
    assert "session_reset" not in json.loads(_post(served, {k: v for k, v in body.items() if k != "session"})[1])


def test_a_stream_closed_before_its_first_event_ends_its_job(served) -> None:
    """``events = await completions.stream(req)`` queues the job; closing the events unread (a response that failed
    before iterating them) must end it: an async generator closed before it started runs no ``finally``."""
    import asyncio

    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import Limits, parse_completion

    limits = Limits(max_tokens=10 ** 6)
    comp = Completions(served.engine, served.codec, "tiny", limits)
    before = served.engine.stats()["cancelled"]

    async def unread() -> None:
        events = await comp.stream(parse_completion({"prompt": "the", "max_tokens": 10 ** 6, "stream": True},
                                                    limits))
        await events.aclose()

    asyncio.run(unread())
    deadline = time.monotonic() + 10
    while served.engine.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.engine.stats()["cancelled"] == before + 1 and served.engine.stats()["running"] == 0
