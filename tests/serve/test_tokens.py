"""The tokenizer routes (vLLM's shapes) against a live server: what lm-evaluation-harness's remote tokenizer asks."""

from __future__ import annotations

import pytest

from tests.serve.conftest import save_served_model, start_server
from transformer_xl.data import Vocab
from transformer_xl.data.codec import TextCodec
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.serve.protocol import Limits
from transformer_xl.serve.tokens import eos_text, tokenizer_info

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.mark.filterwarnings("ignore:1 words of the prompt")  # "zebra": <unk>, as the server reads it (silently)
def test_tokenize_gives_txl_scores_ids_which_a_completion_reads_and_detokenize_the_text(served) -> None:
    """``/tokenize`` gives the ids ``txl score`` reads (the training text's tokenization, a line end only at a newline),
    so that a client sending them gets txl score's log-probabilities (tests/serve/test_harness_client.py)."""
    lines = LineEncoder(served.codec.vocab, level=served.codec.level)
    for prefix in ("", "/v1"):
        for text in ("the cat sat", "the zebra\non a mat", "", "  a  dog "):
            status, doc = served.post(prefix + "/tokenize", {"prompt": text, "add_special_tokens": False})
            ids = lines.string_ids(text)
            assert status == 200 and doc == {"tokens": ids, "count": len(ids), "max_model_len": 8192}, doc
            if ids:
                out = served.client().completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True,
                                                         logprobs=0)
                assert out.usage.prompt_tokens == len(ids)  # what the completions route read
            status, back = served.post(prefix + "/detokenize", {"tokens": ids})
            assert status == 200 and back == {"prompt": served.codec.decode(ids)}
        status, info = served.request("GET", prefix + "/tokenizer_info")[::2]
        assert status == 200 and info["eos_token"] == "<eos>" and info["bos_token"] is None
        assert info["pad_token"] is None and info["model_max_length"] == 8192


@pytest.mark.parametrize("path, body, param, code", [
    ("/tokenize", {"text": "a"}, "prompt", "invalid_type"),
    ("/tokenize", {"prompt": ["a"]}, "prompt", "invalid_type"),
    ("/tokenize", ["a"], None, "invalid_body"),
    ("/tokenize", {"prompt": "x" * 300_000}, "prompt", "context_length_exceeded"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt", "invalid_value"),
    ("/detokenize", {"tokens": "1 2"}, "tokens", "invalid_type"),
    ("/detokenize", {"tokens": [1, True]}, "tokens", "invalid_type"),
    ("/detokenize", {"tokens": [1, 10 ** 6]}, "tokens", "invalid_value"),
    ("/detokenize", {"tokens": [-1]}, "tokens", "invalid_value"),
    ("/detokenize", {"tokens": [1] * 8193}, "tokens", "context_length_exceeded"),  # counted before anything else
    ("/detokenize", {"tokens": ["x"] * 8193}, "tokens", "context_length_exceeded"),
])
def test_bad_tokenizer_requests_are_400(served, path, body, param, code) -> None:
    status, doc = served.post(path, body)
    assert status == 400 and (doc["error"]["param"], doc["error"]["code"]) == (param, code), doc


def test_a_long_text_is_tokenized_beyond_max_prompt_tokens_but_not_beyond_max_prompt_chars(tmp_path) -> None:
    """A client cuts a long document into windows by its ids: only the characters are bounded."""
    gen = start_server(save_served_model(tmp_path), limits=Limits(max_prompt_tokens=4, max_prompt_chars=64))
    served = next(gen)
    try:
        status, doc = served.post("/tokenize", {"prompt": "the cat sat on a red mat"})
        assert status == 200 and doc["count"] == 7 and doc["max_model_len"] == 4
        status, doc = served.post("/tokenize", {"prompt": "the " * 20})
        assert status == 400 and "--max-prompt-chars" in doc["error"]["message"]
        status, doc = served.request("POST", "/tokenize", b'{"prompt": "a"}', {"Content-Type": "text/plain"})[::2]
        assert status == 415
    finally:
        gen.close()


def test_lm_eval_finds_the_remote_tokenizer_with_and_without_a_key(served, tmp_path) -> None:
    utils = pytest.importorskip("lm_eval.utils")
    assert utils.check_remote_tokenizer_support(served.url + "/completions") is True
    tokenizer = utils.RemoteTokenizer(served.url + "/completions")
    assert tokenizer.encode("the cat") == served.codec.encode("the cat")
    assert tokenizer.eos_token_id == served.codec.vocab.eos_idx
    assert tokenizer.decode([2, 3]) == served.codec.decode([2, 3])
    gen = start_server(save_served_model(tmp_path), api_key="k")
    keyed = next(gen)
    try:
        assert utils.check_remote_tokenizer_support(keyed.url + "/completions", max_retries=1) is False
        assert utils.check_remote_tokenizer_support(keyed.url + "/completions", auth_token="k") is True
    finally:
        gen.close()


def test_eos_text_is_what_encodes_to_the_eos_id_alone() -> None:
    words = Vocab(["<eos>", "<unk>", "a", "b"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    assert eos_text(TextCodec(words, "word")) == "<eos>"
    chars = Vocab(["<eos>", "<unk>", "a", "b", "<", ">", "e", "o", "s"], special=["<eos>", "<unk>"], eos="<eos>",
                  unk="<unk>")
    assert eos_text(TextCodec(chars, "char")) == "\n"  # "<eos>" is five characters there
    none = Vocab(["<unk>", "a", "b"], special=["<unk>"], unk="<unk>")
    codec = TextCodec(none, "char")
    assert eos_text(codec) is None
    assert tokenizer_info(codec, Limits(max_prompt_tokens=7)) == {
        "eos_token": None, "bos_token": None, "pad_token": None, "model_max_length": 7, "vocab_size": 3,
        "tokenizer_class": "txl char-level"}
