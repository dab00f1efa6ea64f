"""The tokenizer routes of ``txl serve``: vLLM's shapes, which lm-evaluation-harness's ``local-completions`` backend
finds by itself (its ``RemoteTokenizer``), so that it counts, cuts and scores text in this model's own tokens.

===========================  =============================================================================
route                        what it does
===========================  =============================================================================
``GET /tokenizer_info``      ``{"eos_token", "bos_token": null, "pad_token": null, "model_max_length", ...}``
``POST /tokenize``           ``{"prompt": TEXT}`` -> ``{"tokens": [ids], "count", "max_model_len"}``
``POST /detokenize``         ``{"tokens": [ids]}`` -> ``{"prompt": TEXT}``
===========================  =============================================================================

:mod:`~transformer_xl.serve.app` serves each under ``/v1/`` too, behind the API key and the body limits as
completions are. The ids of a text are those ``txl score`` gives it (``LineEncoder.string_ids`` of
:mod:`transformer_xl.inference.lines`: the training text's own tokenization, a line end only where the text has a
newline), so that a client sending them as a prompt gets ``txl score``'s log-probabilities; a string prompt of
``/v1/completions`` is read by the generation codec instead, which also splits punctuation off raw words. A text is
refused beyond ``--max-prompt-chars`` characters but not beyond ``--max-prompt-tokens`` tokens (a client cuts a long
document into windows by these very ids). Encoding and decoding run off the event loop.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from transformer_xl.errors import DataError
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.serve.protocol import Limits, RequestError, check_prompt_chars, check_unicode, parse_json

#: ``warnings.catch_warnings`` swaps the process's filter list: two threads inside it at once could leave the
#: ``ignore`` behind for good, so the encoders of this module take turns.
QUIET = threading.Lock()


def encode_text(codec: Any, text: str) -> list[int]:
    """The ids of ``text`` as a string prompt reads it (words the vocabulary lacks become ``<unk>`` silently)."""
    with QUIET, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return codec.encode(text)


def eos_text(codec: Any) -> str | None:
    """The text that encodes to the end-of-line id alone: the vocabulary's symbol (``<eos>`` for words), else a
    newline (characters), else None (a client takes ``encode(eos_token)[0]`` for the end-of-text id)."""
    eos = codec.vocab.eos_idx
    for text in (codec.vocab.eos, "\n"):
        if eos is not None and text is not None and encode_text(codec, text) == [eos]:
            return text
    return None


def tokenizer_info(codec: Any, limits: Limits) -> dict[str, Any]:
    """``GET /tokenizer_info``."""
    return {"eos_token": eos_text(codec), "bos_token": None, "pad_token": None,
            "model_max_length": limits.max_prompt_tokens, "vocab_size": len(codec.vocab),
            "tokenizer_class": f"txl {codec.level}-level"}


def text_field(doc: Any, limits: Limits) -> str:
    """The ``prompt`` of a ``POST /tokenize`` body, checked."""
    if not isinstance(doc, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(doc).__name__}", code="invalid_body")
    text = doc.get("prompt")
    if not isinstance(text, str):
        raise RequestError(f"'prompt' must be a string, got {type(text).__name__}", param="prompt",
                           code="invalid_type")
    return check_unicode(check_prompt_chars(text, limits), "prompt")


def ids_field(doc: Any, n_token: int, most: int) -> list[int]:
    """The ``tokens`` of a ``POST /detokenize`` body, checked: at most ``most`` ids (counted first), each in the
    vocabulary."""
    ids = doc.get("tokens") if isinstance(doc, dict) else None
    if isinstance(ids, list) and len(ids) > most:
        raise RequestError(f"'tokens' has {len(ids)} ids; this server decodes at most {most} (--max-prompt-tokens)",
                           param="tokens", code="context_length_exceeded")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("'tokens' must be a list of token ids", param="tokens", code="invalid_type")
    if ids and (min(ids) < 0 or max(ids) >= n_token):
        raise RequestError(f"token ids must lie in [0, {n_token})", param="tokens", code="invalid_value")
    return ids


def scoring_encoder(codec: Any) -> Callable[[str], list[int]]:
    """The ids ``txl score`` gives a piece of text, for the vocabulary and level of ``codec`` (a subword model's
    codec already encodes each line as its training text was)."""
    if codec.level == "subword":
        return lambda text: encode_text(codec, text)
    lines = LineEncoder(codec.vocab, level=codec.level)

    def encode(text: str) -> list[int]:
        try:
            return lines.string_ids(text)
        except DataError as exc:  # a symbol the vocabulary lacks, and no <unk> to map it to
            raise RequestError(str(exc), param="prompt", code="invalid_value") from None

    return encode


def tokenize(encode: Callable[[str], list[int]], limits: Limits, body: bytes) -> dict[str, Any]:
    """``POST /tokenize`` of a request ``body`` (the app runs it in a worker thread)."""
    ids = encode(text_field(parse_json(body), limits))
    return {"tokens": ids, "count": len(ids), "max_model_len": limits.max_prompt_tokens}


def detokenize(codec: Any, limits: Limits, body: bytes) -> dict[str, str]:
    """``POST /detokenize`` of a request ``body`` (the app runs it in a worker thread)."""
    return {"prompt": codec.decode(ids_field(parse_json(body), len(codec.vocab), limits.max_prompt_tokens))}
