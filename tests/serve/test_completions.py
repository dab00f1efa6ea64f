"""Requests to responses: prompt ids checked against the vocabulary, echo and log-probabilities, the streamed form."""

from __future__ import annotations

import time

import pytest

from transformer_xl.serve.protocol import RequestError

openai = pytest.importorskip("openai")


def test_prompt_ids_are_checked(served) -> None:
    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.protocol import Limits

    comp = Completions(served.engine, served.codec, "tiny", Limits(max_prompt_tokens=3))
    assert comp.prompt_ids("the cat") == served.codec.encode("the cat")
    assert comp.prompt_ids("zebra") == [served.codec.vocab.unk_idx]  # unknown words become <unk>
    with pytest.raises(RequestError, match=r"lie in \[0, "):
        comp.prompt_ids([0, len(served.codec.vocab)])
    with pytest.raises(RequestError) as info:
        comp.prompt_ids("the cat sat on")
    assert info.value.code == "context_length_exceeded"


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


def test_a_whole_completion_ends_when_its_client_goes_away(served) -> None:
    """The client is asked about once a second while the job runs (it sends events without pause, so not only after
    a quiet second), and no more often; its job is cancelled, and the engine drops the events it sends after the
    request's loop has closed."""
    import asyncio

    from transformer_xl.serve.completions import POLL, Completions
    from transformer_xl.serve.protocol import Limits, parse_completion

    limits = Limits(max_tokens=10 ** 6)  # runs until the client goes away
    comp = Completions(served.engine, served.codec, "tiny", limits)
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
    out = served.client(timeout=30).completions.create(model="tiny", prompt="the", max_tokens=2)
    assert out.usage.completion_tokens == 2  # the engine thread lives on
