"""The completions protocol: what a request body may hold, and the error objects of what it may not."""

from __future__ import annotations

import pytest

from transformer_xl.serve.protocol import (
    Limits,
    RequestError,
    completion_object,
    models_object,
    parse_completion,
    usage_object,
)


def test_defaults_are_the_protocols() -> None:
    req = parse_completion({"prompt": "hello"})
    assert req.prompts == ["hello"] and req.max_tokens == 16 and req.temperature == 1.0 and req.n == 1
    assert req.logprobs is None and not req.stream and not req.echo and req.stop == [] and req.session is None


@pytest.mark.parametrize("prompt, prompts", [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]),
                                             ([[1], [2, 3]], [[1], [2, 3]]), (["a", [4]], ["a", [4]])])
def test_every_prompt_form(prompt, prompts) -> None:
    assert parse_completion({"prompt": prompt}).prompts == prompts


def test_extensions_and_stream_options() -> None:
    req = parse_completion({"prompt": "a", "top_k": 4, "min_p": 0.1, "repetition_penalty": 1.3,
                            "no_repeat_ngram_size": 3, "session": "s", "stream": True, "stop": "x",
                            "stream_options": {"include_usage": True}, "unknown_field": [1]})
    assert (req.top_k, req.min_p, req.repetition_penalty, req.no_repeat_ngram_size) == (4, 0.1, 1.3, 3)
    assert req.session == "s" and req.stream and req.include_usage and req.stop == ["x"]


@pytest.mark.parametrize("body, param, code", [
    ({}, "prompt", "missing_field"),
    ({"prompt": None}, "prompt", "missing_field"),
    ({"prompt": 3}, "prompt", "invalid_type"),
    ({"prompt": []}, "prompt", "invalid_type"),
    ({"prompt": [True]}, "prompt", "invalid_type"),
    ({"prompt": "a", "max_tokens": 1.5}, "max_tokens", "invalid_type"),
    ({"prompt": "a", "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens", "invalid_value"),
    ({"prompt": "a", "max_tokens": 11}, "max_tokens", "invalid_value"),
    ({"prompt": "a", "temperature": "hot"}, "temperature", "invalid_type"),
    ({"prompt": "a", "temperature": float("nan")}, "temperature", "invalid_value"),
    ({"prompt": "a", "top_p": 0}, "top_p", "invalid_value"),
    ({"prompt": "a", "top_k": -1}, "top_k", "invalid_value"),
    ({"prompt": "a", "logprobs": 6}, "logprobs", "invalid_value"),
    ({"prompt": "a", "n": 0}, "n", "invalid_value"),
    ({"prompt": "a", "n": 5}, "n", "invalid_value"),  # over max_choices
    ({"prompt": "a", "stream": "yes"}, "stream", "invalid_type"),
    ({"prompt": "a", "stop": [""]}, "stop", "invalid_type"),
    ({"prompt": "a", "session": ""}, "session", "invalid_type"),
    ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
    ({"prompt": "a", "suffix": "b"}, "suffix", None),
    ({"prompt": "a", "best_of": 3}, "best_of", None),
    ({"prompt": "a", "logit_bias": {"1": 5}}, "logit_bias", None),
    ({"prompt": "a", "presence_penalty": 1.0}, "presence_penalty", None),
    ({"prompt": ["a", "b"], "session": "s"}, "session", None),
])
def test_bad_fields_are_named_in_a_400(body, param, code) -> None:
    with pytest.raises(RequestError) as info:
        parse_completion(body, Limits(max_tokens=10, max_choices=4))
    err = info.value
    assert err.status == 400 and err.param == param and err.code == code
    assert err.body() == {"error": {"message": str(err), "type": "invalid_request_error", "param": param,
                                    "code": code}}


def test_a_body_that_is_not_an_object() -> None:
    with pytest.raises(RequestError, match="JSON object"):
        parse_completion(["prompt"])


def test_response_objects() -> None:
    doc = completion_object("cmpl-1", "m", [{"index": 0}], usage_object(3, 4), 5)
    assert doc["object"] == "text_completion" and doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                                                   "total_tokens": 7}
    assert "usage" not in completion_object("cmpl-1", "m", [], None, 5)
    assert models_object("m", 1)["data"] == [{"id": "m", "object": "model", "created": 1, "owned_by": "txl"}]
