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
    # the extensions and the other sampling settings: off
    assert (req.top_p, req.top_k, req.min_p, req.repetition_penalty, req.no_repeat_ngram_size) == (1.0, 0, 0.0, 1.0, 0)
    assert (req.seed, req.model, req.include_usage) == (None, None, False)


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
    ({"prompt": "a", "session": ""}, "session", "invalid_session_id"),
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


LIMITS = Limits(max_tokens=10, max_choices=4, max_stop_chars=4)
BIG = 2 ** 63


@pytest.mark.parametrize("body, param, code, message", [
    ({"prompt": "a", "max_tokens": 1.5}, "max_tokens", "invalid_type",
     "'max_tokens' must be an integer, got float 1.5"),
    ({"prompt": "a", "max_tokens": True}, "max_tokens", "invalid_type",
     "'max_tokens' must be an integer, got bool True"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens", "invalid_value", "'max_tokens' must be between 0 and 10, got -1"),
    ({"prompt": "a", "max_tokens": 11}, "max_tokens", "invalid_value", "'max_tokens' must be between 0 and 10, got 11"),
    ({"prompt": "a", "top_k": -1}, "top_k", "invalid_value", "'top_k' must be >= 0, got -1"),
    ({"prompt": "a", "seed": BIG}, "seed", "invalid_value",
     f"'seed' must be between {-BIG} and {BIG - 1}, got {BIG}"),
    ({"prompt": "a", "seed": -BIG - 1}, "seed", "invalid_value",
     f"'seed' must be between {-BIG} and {BIG - 1}, got {-BIG - 1}"),
    ({"prompt": "a", "temperature": "hot"}, "temperature", "invalid_type",
     "'temperature' must be a number, got str 'hot'"),
    ({"prompt": "a", "temperature": False}, "temperature", "invalid_type",
     "'temperature' must be a number, got bool False"),
    ({"prompt": "a", "temperature": float("nan")}, "temperature", "invalid_value",
     "'temperature' must be between 0.0 and 2.0, got nan"),
    ({"prompt": "a", "temperature": float("inf")}, "temperature", "invalid_value",
     "'temperature' must be between 0.0 and 2.0, got inf"),
    ({"prompt": "a", "temperature": -0.5}, "temperature", "invalid_value",
     "'temperature' must be between 0.0 and 2.0, got -0.5"),
    ({"prompt": "a", "temperature": 2.5}, "temperature", "invalid_value",
     "'temperature' must be between 0.0 and 2.0, got 2.5"),
    ({"prompt": "a", "top_p": 0}, "top_p", "invalid_value", "'top_p' must be in (0.0, 1.0], got 0"),
    ({"prompt": "a", "top_p": 1.5}, "top_p", "invalid_value", "'top_p' must be in (0.0, 1.0], got 1.5"),
    ({"prompt": "a", "min_p": 1.5}, "min_p", "invalid_value", "'min_p' must be between 0.0 and 1.0, got 1.5"),
    ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty", "invalid_value",
     "'repetition_penalty' must be in (0.0, 10.0], got 0"),
    ({"prompt": "a", "repetition_penalty": 11}, "repetition_penalty", "invalid_value",
     "'repetition_penalty' must be in (0.0, 10.0], got 11"),
    ({"prompt": "a", "no_repeat_ngram_size": -1}, "no_repeat_ngram_size", "invalid_value",
     "'no_repeat_ngram_size' must be >= 0, got -1"),
    ({"prompt": "a", "logprobs": 6}, "logprobs", "invalid_value", "'logprobs' must be between 0 and 5, got 6"),
    ({"prompt": "a", "n": 0}, "n", "invalid_value", "'n' must be >= 1, got 0"),
    ({"prompt": "a", "stream": "y" * 100}, "stream", "invalid_type",
     "'stream' must be a boolean, got str '" + "y" * 27 + "..." + "y" * 28 + "'"),  # cut, not built whole
    ({"prompt": "a", "stream": [[[[[1]]]]]}, "stream", "invalid_type",
     "'stream' must be a boolean, got list [[[[...]]]]"),
    ({"prompt": "a", "echo": 1}, "echo", "invalid_type", "'echo' must be a boolean, got int 1"),
    ({"prompt": "a", "stream_options": {"include_usage": "y"}}, "include_usage", "invalid_type",
     "'include_usage' must be a boolean, got str 'y'"),
    ({"prompt": "a", "stream_options": []}, "stream_options", "invalid_type",
     "'stream_options' must be an object, got list []"),
    ({}, "prompt", "missing_field", "'prompt' is required"),
    ({"prompt": None}, "prompt", "missing_field", "'prompt' is required"),
    ({"prompt": ["a", 3]}, "prompt", "invalid_type",
     "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists, got list ['a', 3]"),
    ({"prompt": [[1], [True]]}, "prompt", "invalid_type",
     "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists, got list "
     "[[1], [True]]"),
    ({"prompt": [[1], []]}, "prompt", "invalid_type",
     "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists, got list [[1], []]"),
    ({"prompt": "a", "stop": 3}, "stop", "invalid_type",
     "'stop' must be a non-empty string or a list of them, got int 3"),
    ({"prompt": "a", "stop": ["a", 3]}, "stop", "invalid_type",
     "'stop' must be a non-empty string or a list of them, got list ['a', 3]"),
    ({"prompt": "a", "stop": list("abcde")}, "stop", "invalid_value", "'stop' takes at most 4 strings, got 5"),
    ({"prompt": "a", "suffix": "b"}, "suffix", None, "'suffix' (insertion) is not supported by this model"),
    ({"prompt": "a", "best_of": 2}, "best_of", None, "'best_of' other than 'n' is not supported"),
    ({"prompt": "a", "best_of": 0}, "best_of", "invalid_value", "'best_of' must be >= 1, got 0"),
    ({"prompt": "a", "logit_bias": {"1": 5}}, "logit_bias", None, "'logit_bias' is not supported"),
    ({"prompt": "a", "presence_penalty": 1.0}, "presence_penalty", None,
     "'presence_penalty' is not supported; use 'repetition_penalty' or 'no_repeat_ngram_size'"),
    ({"prompt": "a", "frequency_penalty": -1}, "frequency_penalty", None,
     "'frequency_penalty' is not supported; use 'repetition_penalty' or 'no_repeat_ngram_size'"),
    ({"prompt": "a", "presence_penalty": 3}, "presence_penalty", "invalid_value",
     "'presence_penalty' must be between -2.0 and 2.0, got 3"),
    ({"prompt": "a", "model": 3}, "model", "invalid_type", "'model' must be a string, got int 3"),
    ({"prompt": "a", "session": 5}, "session", "invalid_type", "'session' must be a string, got int 5"),
    ({"prompt": "a", "session": "s" * 129}, "session", "invalid_session_id",
     "a session id is 1 to 128 of the characters A-Z a-z 0-9 . _ : - (not . nor ..), got " + repr("s" * 129)[:60]),
    ({"prompt": "a", "stop": ["x" * 5]}, "stop", "invalid_value",
     "a stop string has 5 characters; this server takes at most 4 (--max-stop-chars)"),
    ({"prompt": "a", "stop": "\udc80"}, "stop", "invalid_value",
     "'stop' holds a lone surrogate ('\\udc80' at 0): not Unicode text"),
    ({"prompt": ["a", "b\ud800"]}, "prompt", "invalid_value",
     "'prompt' holds a lone surrogate ('\\ud800' at 1): not Unicode text"),
    ({"prompt": ["a", "b"], "n": 3}, "n", "invalid_value",
     "2 prompt(s) x n=3 asks for 6 choices; this server gives at most 4 per request"),
    ({"prompt": "a", "n": 2, "session": "s"}, "session", None,
     "a 'session' continues one text: give one prompt and n=1"),
])
def test_each_refusal_names_its_field_in_its_own_words(body, param, code, message) -> None:
    with pytest.raises(RequestError) as info:
        parse_completion(body, LIMITS)
    err = info.value
    assert (str(err), err.param, err.code, err.status, err.kind) == (message, param, code, 400, "invalid_request_error")


def test_bounds_are_inclusive_and_numbers_come_back_typed() -> None:
    req = parse_completion({"prompt": "a", "max_tokens": 10, "temperature": 2, "top_p": 1, "min_p": 1,
                            "repetition_penalty": 10, "logprobs": 5, "seed": BIG - 1, "top_k": 10 ** 9,
                            "stop": list("abcd"), "n": 2, "best_of": 2, "session": None, "suffix": "",
                            "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": None, "model": "m"}, LIMITS)
    assert (req.max_tokens, req.temperature, req.top_p, req.min_p, req.repetition_penalty, req.logprobs) == (
        10, 2.0, 1.0, 1.0, 10.0, 5)
    assert type(req.temperature) is float and type(req.top_p) is float and type(req.repetition_penalty) is float
    assert (req.seed, req.top_k, req.stop, req.n, req.model) == (BIG - 1, 10 ** 9, list("abcd"), 2, "m")
    low = parse_completion({"prompt": "a", "max_tokens": 0, "temperature": 0, "min_p": 0, "seed": -BIG, "top_k": 0,
                            "logprobs": 0, "session": "s" * 128, "stream_options": None}, LIMITS)
    assert (low.max_tokens, low.temperature, low.min_p, low.seed, low.top_k, low.logprobs) == (0, 0.0, 0.0, -BIG, 0, 0)
    assert low.session == "s" * 128 and low.include_usage is False
    nulls = parse_completion({"prompt": "a", "max_tokens": None, "temperature": None, "n": None, "echo": None,
                              "stream": None, "stop": None}, LIMITS)
    assert (nulls.max_tokens, nulls.temperature, nulls.n, nulls.echo, nulls.stream, nulls.stop) == (
        10, 1.0, 1, False, False, [])  # the default max_tokens is 16, or the server's limit when lower
    assert parse_completion({"prompt": "a"}).max_tokens == 16
    flags = parse_completion({"prompt": "a", "echo": True, "stream": False})
    assert flags.echo is True and flags.stream is False
    assert parse_completion({"prompt": ["a", "b"], "n": 2}, LIMITS).prompts == ["a", "b"]  # 4 choices: allowed
    assert parse_completion({"prompt": [[1, 2], "b"]}).prompts == [[1, 2], "b"]


def test_a_body_that_is_not_an_object_is_named() -> None:
    with pytest.raises(RequestError) as info:
        parse_completion(["prompt"])
    err = info.value
    assert (str(err), err.code, err.param) == ("the request body must be a JSON object, got list", "invalid_body", None)


def test_error_and_response_objects_in_full() -> None:
    from transformer_xl.serve.protocol import completion_id, error_body

    assert error_body("m") == {"error": {"message": "m", "type": "invalid_request_error", "param": None,
                                         "code": None}}
    err = RequestError("gone", status=404, param="session", code="session_not_found", kind="not_found_error")
    assert err.body() == {"error": {"message": "gone", "type": "not_found_error", "param": "session",
                                    "code": "session_not_found"}}
    assert (err.status, RequestError("x").status, RequestError("x").kind) == (404, 400, "invalid_request_error")
    a, b = completion_id(), completion_id()
    assert a != b and a.startswith("cmpl-") and len(a) == 5 + 32
    assert completion_object("c", "m", [{"index": 0}], {"u": 1}, 7) == {
        "id": "c", "object": "text_completion", "created": 7, "model": "m", "choices": [{"index": 0}],
        "usage": {"u": 1}}
    assert usage_object(2, 0) == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}
    import time

    before = int(time.time())
    doc = models_object("m")
    assert doc["object"] == "list" and len(doc["data"]) == 1 and before <= doc["data"][0]["created"] <= time.time()


@pytest.mark.parametrize("sid, ok", [
    ("s1", True), ("a.b:c-d_E9", True), ("...", True), (".a", True), ("x" * 128, True), ("x" * 129, False),
    ("", False), (".", False), ("..", False), ("a/b", False), ("a b", False), ("caf\u00e9", False), ("a\n", False),
    ("a%2Fb", False), ("a?b", False), ("a#b", False), ("a\\b", False)])
def test_session_ids_are_of_a_safe_alphabet(sid, ok) -> None:
    """Letters, digits and ``._:-``: an id is safe in a URL path (so it can be deleted), a log line and a file name."""
    from transformer_xl.serve.protocol import check_session_id

    if ok:
        assert check_session_id(sid) == sid and parse_completion({"prompt": "a", "session": sid}).session == sid
    else:
        for call in (lambda: check_session_id(sid), lambda: parse_completion({"prompt": "a", "session": sid})):
            with pytest.raises(RequestError) as info:
                call()
            assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_session_id", "session")


@pytest.mark.parametrize("body, message", [
    (b"{not json", "the request body is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
                   "column 2 (char 1))"),
    (b"[" * 100_000, "the request body is JSON nested too deeply"),
    ('{"prompt": "a"}'.encode("utf-16"), "the request body is not UTF-8 text (invalid start byte at byte 0)"),
    (b'{"prompt": "\xff"}', "the request body is not UTF-8 text (invalid start byte at byte 12)"),
    (b"", "the request body is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
])
def test_a_body_that_is_not_json_text_is_400_invalid_json(body, message) -> None:
    from transformer_xl.serve.protocol import parse_json

    with pytest.raises(RequestError) as info:
        parse_json(body)
    assert (str(info.value), info.value.status, info.value.code) == (message, 400, "invalid_json")


def test_json_bodies_parse_with_or_without_a_byte_order_mark() -> None:
    from transformer_xl.serve.protocol import parse_json

    assert parse_json(b'{"a": [1, "\xc3\xa9"]}') == {"a": [1, "\u00e9"]}
    assert parse_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    assert parse_json(b"[" * 500 + b"]" * 500) is not None  # deep, but not too deep
