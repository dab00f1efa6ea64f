"""ONNX export: the graphs equal the PyTorch model, pass onnx.checker, are described; unsupported models refused.

One test exports (``test_the_export_runs_on_onnx_runtime_as_the_model_and_as_described``, through the session's
``onnx_export``); the others check, without exporting, what the export is made of: the names, the traced example
inputs and dynamic axes, the module traced, the description, the files beside the graphs, the checker, the
refusals."""

from __future__ import annotations

import json
import logging
import re
import sys
import warnings

import pytest
import torch

from tests.helpers import tiny_model, word_vocab
from transformer_xl.errors import ConfigError
from transformer_xl.interop.onnx_export import (
    EXPORT_JSON,
    FORMAT,
    GRAPHS,
    LOG_PROBS_DOC,
    MAX_DIM,
    MEMORY_DOC,
    OPSET,
    _quiet,
    _Segment,
    _write_beside,
    check_exportable,
    check_graph,
    describe,
    export_onnx,
    export_spec,
    io_names,
    require_onnx,
)
from transformer_xl.store.manifest import verify_manifest
from transformer_xl.version import __version__

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

#: A model whose lengths differ from one another (so that none stands for another in the description).
LENGTHS = dict(tgt_len=5, mem_len=6, clamp_len=7)


@pytest.fixture(autouse=True)
def _fresh_working_directory(tmp_path, monkeypatch) -> None:
    """Every test in a folder of its own: a path that escapes the export directory (``str(None)`` is ``"None"``)
    lands there, never where another test, or a mutant of this module tested after it, reads."""
    monkeypatch.chdir(tmp_path)


def _run(path, ids, mems):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ins, _ = io_names(len(mems) - 1)
    return session.run(None, {ins[0]: ids.numpy(), **{n: m.numpy() for n, m in zip(ins[1:], mems)}})


def test_the_export_runs_on_onnx_runtime_as_the_model_and_as_described(onnx_export) -> None:
    """The one test that exports: both graphs compute the model's log-probabilities and its memories, uncut, for
    any batch, memory length and (segment graph) segment length; their names, types, fixed and dynamic axes and
    opset are those of ``onnx_export.json``; they pass the full check; the directory holds exactly its files."""
    model, _, export = onnx_export()
    cfg = model.config
    doc = json.loads((export / EXPORT_JSON).read_text())
    assert doc == describe(model, text={"level": "word"})
    manifest = verify_manifest(export, required=True)
    assert set(manifest["files"]) == {*GRAPHS.values(), EXPORT_JSON, "config.json", "vocab.json"}  # no external data
    assert sorted(p.name for p in export.iterdir()) == sorted({*manifest["files"], "MANIFEST.json"})
    assert json.loads((export / "config.json").read_text()) == json.loads(cfg.to_json())
    for name, file in GRAPHS.items():
        check_graph(export / file)
        proto = onnx.load(str(export / file))
        assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {OPSET}
        described = doc["graphs"][name]
        assert len(proto.graph.input) == len(described["inputs"])
        assert len(proto.graph.output) == len(described["outputs"])
        for got, want in [*zip(proto.graph.input, described["inputs"]), *zip(proto.graph.output, described["outputs"])]:
            assert got.name == want["name"]
            assert onnx.helper.tensor_dtype_to_np_dtype(got.type.tensor_type.elem_type).name == want["type"]
        for got, want in zip(proto.graph.input, described["inputs"]):  # an output's axes are expressions: run below
            assert [d.dim_param or d.dim_value for d in got.type.tensor_type.shape.dim] == want["shape"]
    for graph, batch, mlen, qlen in [("segment", 2, 0, 5), ("segment", 1, 6, 3), ("segment", 3, 2, 1),
                                     ("step", 2, 6, 1), ("step", 1, 0, 1), ("step", 3, 9, 1)]:
        torch.manual_seed(batch * 100 + mlen * 10 + qlen)
        ids = torch.randint(0, cfg.n_token, (batch, qlen))
        mems = [torch.randn(batch, mlen, cfg.d_model) for _ in range(cfg.n_layer + 1)]
        log_probs, *new_mems = _run(export / GRAPHS[graph], ids, mems)
        with torch.no_grad():
            out = model(ids, None, mems or None, lengths=cfg.lengths(mem_len=mlen + qlen))
            want = model.log_prob(out.hidden[:, -1])  # [B, V]
        torch.testing.assert_close(torch.from_numpy(log_probs), want, atol=1e-5, rtol=1e-5)
        assert len(new_mems) == cfg.n_layer + 1
        for got, full in zip(new_mems, out.mems):
            assert got.shape == (batch, mlen + qlen, cfg.d_model)  # [memory; segment], no cut in the graph
            torch.testing.assert_close(torch.from_numpy(got), full, atol=1e-5, rtol=1e-5)


def test_the_io_names_are_the_documented_ones_in_graph_order() -> None:
    assert io_names(2) == (["input_ids", "mem_0", "mem_1", "mem_2"],
                           ["log_probs", "new_mem_0", "new_mem_1", "new_mem_2"])
    assert io_names(0) == (["input_ids", "mem_0"], ["log_probs", "new_mem_0"])


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_the_graphs_are_traced_as_they_are_described(graph) -> None:
    """``export_spec``'s example inputs and dynamic axes agree with ``onnx_export.json``: names, types, a fixed
    axis at its size, a dynamic one named and bounded as described, and traced at a size the exporter does not
    fix (2 or more)."""
    model = tiny_model(n_layer=2)
    doc = describe(model)
    spec = export_spec(model.config, qlen=1 if graph == "step" else None)
    described = doc["graphs"][graph]
    assert spec["input_names"] == [i["name"] for i in described["inputs"]]
    assert spec["output_names"] == [o["name"] for o in described["outputs"]]
    ids, mems = spec["args"]
    ids_axes, mem_axes = spec["dynamic_shapes"]
    assert len(mems) == len(mem_axes) == model.config.n_layer + 1
    for example, axes, want in zip((ids, *mems), (ids_axes, *mem_axes), described["inputs"]):
        assert str(example.dtype).removeprefix("torch.") == want["type"]
        assert example.dim() == len(want["shape"])
        for axis, size in enumerate(want["shape"]):
            if isinstance(size, int):
                assert axis not in axes and example.shape[axis] == size
            else:
                dim = axes[axis]
                assert dim.__name__ == size and [dim.min, dim.max] == doc["dynamic_axes"][size]
                assert example.shape[axis] >= 2


def test_the_description_names_every_input_and_output_with_its_shape() -> None:
    model = tiny_model(n_layer=1, **LENGTHS)
    cfg = model.config
    doc = describe(model, opset=OPSET + 1, text={"level": "char"})
    assert doc["format"] == FORMAT and doc["opset"] == OPSET + 1 and doc["text"] == {"level": "char"}
    assert doc["txl_version"] == __version__ and doc["torch_version"] == torch.__version__
    assert doc["memory"] == MEMORY_DOC and doc["log_probs"] == LOG_PROBS_DOC
    assert doc["lengths"] == {"mem_len": 6, "clamp_len": 7, "tgt_len": 5}
    assert doc["dynamic_axes"] == {"batch": [1, MAX_DIM], "seq": [1, MAX_DIM], "mem": [0, MAX_DIM]}
    assert sorted(doc["graphs"]) == sorted(GRAPHS)
    for name, graph in doc["graphs"].items():
        assert graph["file"] == GRAPHS[name]
        ids, *mems = graph["inputs"]
        q = 1 if name == "step" else "seq"
        assert ids == {"name": "input_ids", "type": "int64", "shape": ["batch", q]}
        assert mems == [{"name": f"mem_{i}", "type": "float32", "shape": ["batch", "mem", cfg.d_model]}
                        for i in range(cfg.n_layer + 1)]
        log_probs, *new = graph["outputs"]
        assert log_probs == {"name": "log_probs", "type": "float32", "shape": ["batch", cfg.n_token]}
        assert new == [{"name": f"new_mem_{i}", "type": "float32", "shape": ["batch", f"mem+{q}", cfg.d_model]}
                       for i in range(cfg.n_layer + 1)]
    assert describe(model)["opset"] == OPSET and describe(model)["text"] == {}


def test_the_traced_module_is_the_model_with_its_memories_uncut() -> None:
    """What is exported: ``(log_probs, *new_mems)``, the log-probabilities after the last position and the
    memories followed by the whole segment (no ``mem_len`` cut, no extended context, whatever the config says)."""
    model = tiny_model(n_layer=2, mem_len=2, ext_len=1)
    cfg = model.config
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.n_token, (2, 4))
    mems = tuple(torch.randn(2, 3, cfg.d_model) for _ in range(cfg.n_layer + 1))
    with torch.no_grad():
        log_probs, *new = _Segment(model)(ids, mems)
        out = model(ids, None, list(mems), lengths=cfg.lengths(mem_len=7, ext_len=0))
    torch.testing.assert_close(log_probs, model.log_prob(out.hidden[:, -1]))
    assert [m.shape for m in new] == [(2, 7, cfg.d_model)] * (cfg.n_layer + 1)
    for got, want in zip(new, out.mems):
        torch.testing.assert_close(got, want)


def test_the_check_is_the_full_one(tmp_path) -> None:
    """``check_graph`` runs the checker's strict type inference: an ``Add`` of a float and an int64 tensor (valid
    for the plain checker) is refused."""
    helper, tp = onnx.helper, onnx.TensorProto
    inputs = [helper.make_tensor_value_info("a", tp.FLOAT, [2]), helper.make_tensor_value_info("b", tp.INT64, [2])]
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", tp.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), str(tmp_path / "bad.onnx"))
    onnx.checker.check_model(str(tmp_path / "bad.onnx"))  # the plain check passes it
    with pytest.raises(onnx.shape_inference.InferenceError, match="inconsistent type"):
        check_graph(tmp_path / "bad.onnx")


def test_the_exporters_chatter_is_kept_off_the_console(capsys, caplog) -> None:
    """Inside ``_quiet`` the exporter's prints, warnings and ``torch.onnx`` log records below errors are dropped;
    errors are still logged, and the logger's level is restored after."""
    logger = logging.getLogger("torch.onnx")
    child = logging.getLogger("torch.onnx._internal.exporter")
    before = logger.level
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _quiet():
            print("progress")
            warnings.warn("exporter warning", UserWarning, stacklevel=1)
            child.warning("a warning")
            child.error("an error")
        assert seen == []
    assert capsys.readouterr().out == ""
    assert [r.getMessage() for r in caplog.records] == ["an error"]
    assert logger.level == before
    child.warning("after")
    assert caplog.records[-1].getMessage() == "after"


@pytest.mark.parametrize("missing", ["onnx", "onnxscript"])
def test_a_missing_onnx_package_is_named_with_the_extra(monkeypatch, missing) -> None:
    assert require_onnx() is onnx
    monkeypatch.setitem(sys.modules, missing, None)  # what an environment without the package imports
    with pytest.raises(ConfigError, match=rf"^ONNX export needs the onnx extra \({missing} is missing\): pip install "
                                          r"-e '\.\[onnx\]' in the txl checkout \(or its wheel with the extra: "
                                          r"'transformer_xl-VERSION-py3-none-any.whl\[onnx\]'\)$"):
        require_onnx()


@pytest.mark.parametrize("tokenizer", [False, True])
def test_the_files_beside_the_graphs(tmp_path, tokenizer) -> None:
    """``config.json``, the vocabulary, the tokenizer (recorded in the text options) and ``onnx_export.json``;
    the caller's text options are left as they were."""
    vocab = word_vocab()
    model = tiny_model(n_token=len(vocab))
    (tmp_path / "tok.json").write_text('{"model": "subword"}')
    (tmp_path / "out").mkdir()
    text = {"level": "word"}
    _write_beside(tmp_path / "out", model, vocab_json=vocab.to_json(), opset=OPSET + 1, text=text,
                  tokenizer=tmp_path / "tok.json" if tokenizer else None)
    out = tmp_path / "out"
    assert text == {"level": "word"}
    want_text = {"level": "word", "tokenizer": "tokenizer.json"} if tokenizer else {"level": "word"}
    assert json.loads((out / EXPORT_JSON).read_text()) == describe(model, opset=OPSET + 1, text=want_text)
    assert (out / "config.json").read_text() == model.config.to_json()
    assert (out / "vocab.json").read_text() == vocab.to_json()
    files = {"config.json", "vocab.json", EXPORT_JSON} | ({"tokenizer.json"} if tokenizer else set())
    assert {p.name for p in out.iterdir()} == files
    if tokenizer:
        assert (out / "tokenizer.json").read_text() == '{"model": "subword"}'
    (tmp_path / "bare").mkdir()
    _write_beside(tmp_path / "bare", model, vocab_json=None, tokenizer=None, text={}, opset=OPSET)
    assert {p.name for p in (tmp_path / "bare").iterdir()} == {"config.json", EXPORT_JSON}


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(sample_softmax=1), "a model with a sampled softmax (sample_softmax > 0) is not exported to ONNX: its output "
                             "layer is trained for sampling, export a model with the (adaptive) softmax"),
    (dict(same_length=True), "a model with same_length is not exported to ONNX (its mask depends on mem_len); "
                             "generation with same_length off reads the same memory"),
    (dict(attn_type=2), "only the paper's relative encoding (attn_type 0) is exported to ONNX, this model has "
                        "attn_type 2")])
def test_unsupported_models_are_refused_before_anything_is_written(tmp_path, overrides, message) -> None:
    model = tiny_model(**overrides)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        export_onnx(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_quantized_or_float64_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^a int8-quantized model is not exported to ONNX: export the float model$"):
        check_exportable(tiny_model().quantize())
    with pytest.raises(ConfigError, match=r"^a float32 model on the CPU is exported to ONNX, this one is "
                                          r"torch\.float64 on cpu: model\.float\(\)\.cpu\(\) first$"):
        check_exportable(tiny_model().double())
    check_exportable(tiny_model())
    check_exportable(tiny_model(sample_softmax=0))  # 0, as -1: the full softmax (TXLConfig)


def test_a_vocabulary_of_another_size_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="symbols"):
        export_onnx(tiny_model(), tmp_path / "out", vocab=word_vocab())
    assert not (tmp_path / "out").exists()


def _modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in model.named_modules()}


def _frozen_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` training, but for one dropout module a user put in eval mode (a mode of its own)."""
    model.train()
    next(m for m in model.modules() if isinstance(m, torch.nn.Dropout)).eval()
    return model


@pytest.mark.parametrize("mode", ["train", "eval", "train, one dropout frozen", "eval, one dropout training"])
def test_the_model_is_handed_back_in_the_mode_of_each_module_even_when_refused(tmp_path, mode) -> None:
    """A refused export (here: its directory holds the user's files, refused after the model was put in eval mode)
    leaves every module in the train or eval mode it was found in, not only the model as a whole."""
    model = tiny_model(n_layer=1, dropout=0.5, dropatt=0.5, train=mode.startswith("train"))
    if mode == "train, one dropout frozen":
        _frozen_dropout(model)
    elif mode == "eval, one dropout training":
        next(m for m in model.modules() if isinstance(m, torch.nn.Dropout)).train()
    before = _modes(model)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"out holds what txl export onnx did not write \(notes\.txt\)"):
        export_onnx(model, tmp_path / "out")
    assert _modes(model) == before and (tmp_path / "out" / "notes.txt").read_text() == "mine"


@pytest.mark.exports
@pytest.mark.slow
def test_a_model_in_training_with_a_subword_tokenizer_is_exported_as_in_eval(tmp_path) -> None:
    """``export_onnx`` itself (the session's export goes through the CLI, without a tokenizer): a model left
    training, dropout on (but for one dropout module the user froze), is exported as evaluated and handed back with
    each module in its own mode; a subword tokenizer's file is copied beside the graphs, named in the text options
    and listed in the manifest, which says txl export onnx wrote the directory."""
    model = _frozen_dropout(tiny_model(n_layer=1, dropout=0.5, dropatt=0.5, train=True))
    before = _modes(model)
    (tmp_path / "tok.json").write_text('{"model": "subword"}')
    out = export_onnx(model, tmp_path / "out", tokenizer=tmp_path / "tok.json", text={"level": "word"})
    assert out == tmp_path / "out" and model.training and _modes(model) == before
    manifest = verify_manifest(out, required=True)
    assert set(manifest["files"]) == {*GRAPHS.values(), EXPORT_JSON, "config.json", "tokenizer.json"}
    assert manifest["output"] == "txl export onnx"
    assert (out / "tokenizer.json").read_text() == '{"model": "subword"}'
    assert json.loads((out / EXPORT_JSON).read_text())["text"] == {"level": "word", "tokenizer": "tokenizer.json"}
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.n_token, (2, 1))
    mems = [torch.randn(2, 3, model.config.d_model) for _ in range(model.config.n_layer + 1)]
    log_probs, *_ = _run(out / GRAPHS["step"], ids, mems)
    model.eval()
    with torch.no_grad():
        want = model.log_prob(model(ids, None, mems, lengths=model.config.lengths(mem_len=4)).hidden[:, -1])
    torch.testing.assert_close(torch.from_numpy(log_probs), want, atol=1e-5, rtol=1e-5)
