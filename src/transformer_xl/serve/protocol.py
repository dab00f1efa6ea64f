"""The OpenAI completions protocol: a request body checked field by field, error objects, response objects.

Nothing here touches the model: :func:`parse_completion` turns a decoded JSON body into a
:class:`CompletionRequest` or raises :class:`RequestError` (an HTTP status and the protocol's error object:
``{"error": {"message", "type", "param", "code"}}``). Fields the protocol defines but this server does not
implement are refused when they ask for something (``suffix``, ``best_of`` above ``n``, a ``logit_bias``,
presence or frequency penalties); fields unknown to the protocol are ignored, as OpenAI-compatible servers do.
Extensions: ``top_k``, ``min_p``, ``repetition_penalty``, ``no_repeat_ngram_size`` and ``session`` (an id of
:data:`SESSION_ID`'s alphabet). A body is JSON in UTF-8 (:func:`parse_json`: anything else, nesting too deep
included, is a 400 ``invalid_json``); its strings are Unicode (no lone surrogate); each stop string is at most
``Limits.max_stop_chars`` long.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from transformer_xl.safejson import short_repr

#: The most top alternatives ``logprobs`` may ask for (the protocol's limit).
MAX_LOGPROBS = 5
#: The most stop strings (the protocol's limit).
MAX_STOP = 4
#: What a session id may be: 1 to 128 of ``A-Z a-z 0-9 . _ : -`` (safe in a URL path, a log line and a file name),
#: but not ``.`` nor ``..`` (which a browser or an HTTP library would resolve away as a path segment).
SESSION_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9._:-]{1,128}")


class RequestError(Exception):
    """A request the server refuses: an HTTP status and the protocol's error object."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}`` as the protocol writes it."""
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The protocol's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``txl serve`` options)."""

    max_prompt_tokens: int = 8192  # per prompt
    max_tokens: int = 2048  # new tokens per choice
    max_choices: int = 16  # prompts x n in one request
    max_body_bytes: int = 4 * 2 ** 20  # a request body, counted while it arrives (413 beyond)
    max_prompt_chars: int = 262_144  # a text prompt, refused by its length before it is encoded
    max_stop_chars: int = 256  # each stop string


@dataclass
class CompletionRequest:
    """A checked ``POST /v1/completions`` body (defaults as the protocol's)."""

    prompts: list[str | list[int]]  # text, or token ids
    model: str | None = None
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    echo: bool = False
    logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False
    session: str | None = None


def parse_json(body: bytes) -> Any:
    """A request body as JSON: UTF-8 (RFC 8259), nested at most as deep as Python parses; 400 ``invalid_json``
    otherwise (not a 500 for ``[`` x 100000, nor a body in another encoding read as if it were one)."""
    try:
        return json.loads(body.decode("utf-8-sig"))  # a byte order mark tolerated (RFC 8259 Sec. 8.1)
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           code="invalid_json") from None
    except RecursionError:
        raise RequestError("the request body is JSON nested too deeply", code="invalid_json") from None
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})", code="invalid_json") from None


def check_session_id(sid: Any) -> str:
    """``sid`` when it is a valid session id (:data:`SESSION_ID`); 400 otherwise."""
    if not isinstance(sid, str):
        raise _type_error("session", "a string", sid)
    if not SESSION_ID.fullmatch(sid):
        raise RequestError(f"a session id is 1 to 128 of the characters A-Z a-z 0-9 . _ : - (not . nor ..), got "
                           f"{sid!r:.60}", param="session", code="invalid_session_id")
    return sid


def check_unicode(text: str, param: str) -> str:
    """``text`` when it can be written as UTF-8 (a JSON ``\\ud800`` escape makes a lone surrogate, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"'{param}' holds a lone surrogate ({text[exc.start]!r} at {exc.start}): not Unicode text",
                           param=param, code="invalid_value") from None
    return text


def check_prompt_chars(text: str, limits: Limits) -> str:
    """``text`` when it has at most ``limits.max_prompt_chars`` characters (counted before it is encoded); 400
    ``context_length_exceeded`` otherwise."""
    if len(text) > limits.max_prompt_chars:
        raise RequestError(f"the prompt has {len(text)} characters; this server reads at most "
                           f"{limits.max_prompt_chars} per prompt (--max-prompt-chars)", param="prompt",
                           code="context_length_exceeded")
    return text


def _type_error(name: str, want: str, value: Any) -> RequestError:
    return RequestError(f"'{name}' must be {want}, got {type(value).__name__} {short_repr(value)}", param=name,
                        code="invalid_type")


def _get_int(doc: dict, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise _type_error(name, "an integer", value)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name, code="invalid_value")
    return value


def _get_float(doc: dict, name: str, default: float, lo: float, hi: float, *, open_lo: bool = False) -> float:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _type_error(name, "a number", value)
    if not math.isfinite(value) or value < lo or value > hi or (open_lo and value == lo):
        bound = f"in ({lo}, {hi}]" if open_lo else f"between {lo} and {hi}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name, code="invalid_value")
    return float(value)


def _get_bool(doc: dict, name: str) -> bool:
    value = doc.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in value)


def _prompts(doc: dict) -> list[str | list[int]]:
    """``prompt``: a string, a list of strings, a list of token ids, or a list of such lists."""
    value = doc.get("prompt")
    if "prompt" not in doc or value is None:
        raise RequestError("'prompt' is required", param="prompt", code="missing_field")
    if isinstance(value, str):
        return [check_unicode(value, "prompt")]
    if _is_ids(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(p, str) or _is_ids(p) for p in value):
        return [check_unicode(p, "prompt") if isinstance(p, str) else p for p in value]
    raise _type_error("prompt", "a string, a list of strings, a list of token ids or a list of such lists", value)


def _stop(doc: dict, max_chars: int) -> list[str]:
    value = doc.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _type_error("stop", "a non-empty string or a list of them", value)
    if len(stops) > MAX_STOP:
        raise RequestError(f"'stop' takes at most {MAX_STOP} strings, got {len(stops)}", param="stop",
                           code="invalid_value")
    longest = max(map(len, stops), default=0)
    if longest > max_chars:
        raise RequestError(f"a stop string has {longest} characters; this server takes at most {max_chars} "
                           "(--max-stop-chars)", param="stop", code="invalid_value")
    return [check_unicode(s, "stop") for s in stops]


def _refuse_unsupported(doc: dict, n: int) -> None:
    if doc.get("suffix") not in (None, ""):
        raise RequestError("'suffix' (insertion) is not supported by this model", param="suffix")
    best_of = _get_int(doc, "best_of", None, 1)
    if best_of is not None and best_of != n:
        raise RequestError("'best_of' other than 'n' is not supported", param="best_of")
    if doc.get("logit_bias"):
        raise RequestError("'logit_bias' is not supported", param="logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if _get_float(doc, name, 0.0, -2.0, 2.0) != 0.0:
            raise RequestError(f"'{name}' is not supported; use 'repetition_penalty' or 'no_repeat_ngram_size'",
                               param=name)


#: The limits of a server started with the defaults.
DEFAULT_LIMITS = Limits()


def parse_completion(doc: Any, limits: Limits = DEFAULT_LIMITS) -> CompletionRequest:
    """Check a decoded ``POST /v1/completions`` body; :class:`RequestError` names the first bad field."""
    if not isinstance(doc, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(doc).__name__}", code="invalid_body")
    prompts = _prompts(doc)
    n = _get_int(doc, "n", 1, 1)
    _refuse_unsupported(doc, n)
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string", model)
    session = doc.get("session")
    if session is not None:
        check_session_id(session)
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    req = CompletionRequest(
        prompts=prompts, model=model, n=n, session=session, stop=_stop(doc, limits.max_stop_chars),
        max_tokens=_get_int(doc, "max_tokens", min(16, limits.max_tokens), 0, limits.max_tokens),
        temperature=_get_float(doc, "temperature", 1.0, 0.0, 2.0),
        top_p=_get_float(doc, "top_p", 1.0, 0.0, 1.0, open_lo=True),
        top_k=_get_int(doc, "top_k", 0, 0), min_p=_get_float(doc, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_get_float(doc, "repetition_penalty", 1.0, 0.0, 10.0, open_lo=True),
        no_repeat_ngram_size=_get_int(doc, "no_repeat_ngram_size", 0, 0),
        seed=_get_int(doc, "seed", None, -(2 ** 63), 2 ** 63 - 1),
        echo=_get_bool(doc, "echo"), logprobs=_get_int(doc, "logprobs", None, 0, MAX_LOGPROBS),
        stream=_get_bool(doc, "stream"), include_usage=_get_bool(options or {}, "include_usage"))
    if len(prompts) * n > limits.max_choices:
        raise RequestError(f"{len(prompts)} prompt(s) x n={n} asks for {len(prompts) * n} choices; this server "
                           f"gives at most {limits.max_choices} per request", param="n", code="invalid_value")
    if session is not None and (len(prompts) != 1 or n != 1):
        raise RequestError("a 'session' continues one text: give one prompt and n=1", param="session")
    return req


# ---------------------------------------------------------------------------------------------- responses
def completion_id() -> str:
    """A fresh ``cmpl-...`` id."""
    return f"cmpl-{uuid.uuid4().hex}"


def completion_object(cid: str, model: str, choices: list[dict], usage: dict | None, created: int) -> dict:
    """A ``text_completion`` object (a whole response, or one streamed chunk with ``usage`` None)."""
    doc = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage is not None:
        doc["usage"] = usage
    return doc


def usage_object(prompt_tokens: int, completion_tokens: int) -> dict:
    """The protocol's token counts."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def models_object(model: str, created: int | None = None) -> dict:
    """``GET /v1/models``: the one model this server holds."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created or int(time.time()),
                                        "owned_by": "txl"}]}
