"""txl export onnx, and txl generate --backend onnxruntime from its output: the PyTorch backend's tokens."""

from __future__ import annotations

import json

import pytest

from tests.helpers import one_line_error, tiny_model, word_vocab
from transformer_xl.cli import main

pytest.importorskip("onnxruntime")

PROMPT = "the game was well known , the game was"


def _generate(capsys, model: str, *extra: str) -> dict:
    assert main(["generate", model, "--prompt", PROMPT, "--max-new-tokens", "20", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("options", [["--greedy"], ["--seed", "4", "--top-k", "8", "--num-samples", "2"],
                                     ["--greedy", "--mem-len", "3", "--repetition-penalty", "1.3"]])
def test_generate_on_onnxruntime_gives_the_torch_backends_tokens(onnx_export, capsys, options) -> None:
    _, model_dir, export = onnx_export()
    want = _generate(capsys, str(model_dir), *options)
    got = _generate(capsys, str(export), "--backend", "onnxruntime", *options)
    assert got["prompt_ids"] == want["prompt_ids"] and len(got["samples"]) == len(want["samples"])
    for g, w in zip(got["samples"], want["samples"]):
        assert g["token_ids"] == w["token_ids"] and g["text"] == w["text"] and len(g["token_ids"]) == 20
        assert max(abs(a - b) for a, b in zip(g["log_probs"], w["log_probs"])) <= 1e-4


def test_streamed_text_on_onnxruntime_equals_torch(onnx_export, capsys) -> None:
    _, model_dir, export = onnx_export()
    args = ["--prompt", "It was", "--max-new-tokens", "8", "--stream", "--greedy"]
    assert main(["generate", str(model_dir), *args]) == 0
    want = capsys.readouterr().out
    assert main(["generate", str(export), "--backend", "onnxruntime", *args]) == 0
    assert capsys.readouterr().out == want


@pytest.mark.parametrize(("overrides", "why"), [(dict(same_length=True), "same_length"),
                                                (dict(sample_softmax=4), "sampled softmax")])
def test_export_refuses_an_unsupported_model_in_one_line(tmp_path, capsys, overrides, why) -> None:
    vocab = word_vocab()
    tiny_model(n_token=len(vocab), **overrides).save_pretrained(tmp_path / "m", vocab=vocab)
    assert main(["export", "onnx", str(tmp_path / "m"), str(tmp_path / "out")]) == 2
    assert why in one_line_error(capsys, "txl export: error:")
    assert not (tmp_path / "out").exists()


def test_onnxruntime_backend_refusals_are_one_line(onnx_export, tmp_path, capsys) -> None:
    _, model_dir, export = onnx_export()
    assert main(["generate", str(tmp_path / "nowhere"), "--backend", "onnxruntime"]) == 2
    assert "not found" in one_line_error(capsys, "txl generate: error:")
    assert main(["generate", str(model_dir), "--backend", "onnxruntime"]) == 2
    assert "not an ONNX export" in one_line_error(capsys, "txl generate: error:")
    assert main(["generate", str(export), "--backend", "onnxruntime", "--captured"]) == 2
    assert "--captured" in one_line_error(capsys, "txl generate: error:")
    assert main(["export", "onnx", str(tmp_path / "nowhere"), str(tmp_path / "out")]) != 0
    one_line_error(capsys, "txl export: error:")
