"""ONNX export: the graphs equal the PyTorch model, pass onnx.checker, are described; unsupported models refused."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import tiny_model
from transformer_xl.errors import ConfigError
from transformer_xl.interop.onnx_export import EXPORT_JSON, GRAPHS, OPSET, check_exportable, export_onnx, io_names

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _run(path, ids, mems):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ins, _ = io_names(len(mems) - 1)
    return session.run(None, {ins[0]: ids.numpy(), **{n: m.numpy() for n, m in zip(ins[1:], mems)}})


@pytest.mark.parametrize(("graph", "batch", "mlen", "qlen"), [
    ("segment", 2, 0, 5), ("segment", 1, 6, 3), ("segment", 3, 2, 1), ("step", 2, 6, 1), ("step", 1, 0, 1)])
def test_exported_graphs_equal_the_model(onnx_export, graph, batch, mlen, qlen) -> None:
    model, _, export = onnx_export
    cfg = model.config
    torch.manual_seed(batch * 100 + mlen * 10 + qlen)
    ids = torch.randint(0, cfg.n_token, (batch, qlen))
    mems = [torch.randn(batch, mlen, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    log_probs, *new_mems = _run(export / GRAPHS[graph], ids, mems)
    with torch.no_grad():
        out = model(ids, None, mems or None, lengths=cfg.lengths(mem_len=mlen + qlen))
        want = model.log_prob(out.hidden[:, -1])  # [B, V]
        kept = model(ids, None, mems, lengths=cfg.lengths()).mems  # the model's own mem_len cut
    torch.testing.assert_close(torch.from_numpy(log_probs), want, atol=1e-5, rtol=1e-5)
    assert len(new_mems) == cfg.n_layer + 1
    for got, full, cut in zip(new_mems, out.mems, kept):
        assert got.shape == (batch, mlen + qlen, cfg.d_model)  # [memory; segment], no cut in the graph
        torch.testing.assert_close(torch.from_numpy(got), full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(got[:, -cfg.mem_len:]), cut, atol=1e-5, rtol=1e-5)


def test_graphs_pass_the_checker_and_are_described(onnx_export) -> None:
    model, _, export = onnx_export
    doc = json.loads((export / EXPORT_JSON).read_text())
    ins, outs = io_names(model.config.n_layer)
    assert ins == ["input_ids", "mem_0", "mem_1", "mem_2"]  # the documented names (n_layer 2), in graph order
    assert outs == ["log_probs", "new_mem_0", "new_mem_1", "new_mem_2"]
    assert doc["opset"] == OPSET and doc["text"] == {"level": "word"}
    for name, file in GRAPHS.items():
        onnx.checker.check_model(str(export / file), full_check=True)
        proto = onnx.load(str(export / file))
        assert [i.name for i in proto.graph.input] == ins == [i["name"] for i in doc["graphs"][name]["inputs"]]
        assert [o.name for o in proto.graph.output] == outs == [o["name"] for o in doc["graphs"][name]["outputs"]]
        assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {OPSET}
        seq = proto.graph.input[0].type.tensor_type.shape.dim[1]
        assert (seq.dim_value == 1) == (name == "step")  # the step's segment is one token, the segment's dynamic
    manifest = json.loads((export / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {*GRAPHS.values(), EXPORT_JSON, "config.json", "vocab.json"}
    assert json.loads((export / "config.json").read_text()) == json.loads(model.config.to_json())


@pytest.mark.parametrize(("overrides", "why"), [
    (dict(sample_softmax=8), "sampled softmax"), (dict(same_length=True), "same_length"),
    (dict(attn_type=2), "attn_type 2")])
def test_unsupported_models_are_refused_before_anything_is_written(tmp_path, overrides, why) -> None:
    model = tiny_model(**overrides)
    with pytest.raises(ConfigError, match=why):
        export_onnx(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_quantized_or_float64_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="quantized"):
        check_exportable(tiny_model().quantize())
    with pytest.raises(ConfigError, match="float64"):
        check_exportable(tiny_model().double())
    check_exportable(tiny_model())


def test_a_vocabulary_of_another_size_is_refused(tmp_path) -> None:
    from tests.helpers import word_vocab

    with pytest.raises(ConfigError, match="symbols"):
        export_onnx(tiny_model(), tmp_path / "out", vocab=word_vocab())
    assert not (tmp_path / "out").exists()
