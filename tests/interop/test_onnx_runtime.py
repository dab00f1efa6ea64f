"""ONNX Runtime over an export: advance equals the model's forward; generation equals the PyTorch backend's; a
missing, incomplete or corrupt export is refused in one line.

Most tests run a *toy* export (:func:`toy_export`): two small graphs built with ``onnx.helper`` in milliseconds,
with the exported graphs' inputs and outputs, whose numbers the test computes itself, and whose step graph differs
from its segment graph (so a test sees which one ran). They go through ONNX Runtime itself. The tests at the end
(session's ``onnx_export``) run a real export of a model against the model."""

from __future__ import annotations

import json
import re
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers import damage_file, tiny_config
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.inference.generate import generate
from transformer_xl.interop.onnx_export import EXPORT_JSON, FORMAT, GRAPHS, OPSET, io_names
from transformer_xl.interop.onnx_runtime import OnnxRecurrence, OnnxRuntimeLM, is_export_dir
from transformer_xl.store.manifest import write_manifest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

#: The toy model: 1 layer (2 memories), d_model 4, 5 tokens.
TOY = tiny_config(n_layer=1, d_model=4, n_head=1, d_head=4, d_inner=4, n_token=5, mem_len=2, clamp_len=4,
                  cutoffs=[])


def _toy_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"table": torch.randn(TOY.n_token, TOY.d_model, generator=g),
            "w": torch.randn(TOY.d_model, TOY.n_token, generator=g),
            "segment": torch.zeros(TOY.n_token), "step": torch.linspace(0.0, 2.0, TOY.n_token)}


def toy_reference(graph: str, ids: torch.Tensor, mems: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """What the toy graph ``graph`` computes: embeddings ``e = table[ids]``; ``new_mem_i = [mem_i; (i + 1) e]``;
    ``log_probs = log_softmax((e[:, -1] + sum of mem_0's positions) @ w + bias)``, the bias the graph's own."""
    w = _toy_weights()
    e = w["table"][ids]
    logits = (e[:, -1] + mems[0].sum(1)) @ w["w"] + w[graph]
    return torch.log_softmax(logits, -1), [torch.cat([m, e * (i + 1)], 1) for i, m in enumerate(mems)]


def _toy_graph(graph: str) -> onnx.ModelProto:
    helper, tp = onnx.helper, onnx.TensorProto
    ins, outs = io_names(TOY.n_layer)
    seq = 1 if graph == "step" else "seq"
    inputs = [helper.make_tensor_value_info(ins[0], tp.INT64, ["batch", seq])]
    inputs += [helper.make_tensor_value_info(n, tp.FLOAT, ["batch", "mem", TOY.d_model]) for n in ins[1:]]
    outputs = [helper.make_tensor_value_info(outs[0], tp.FLOAT, ["batch", TOY.n_token])]
    outputs += [helper.make_tensor_value_info(n, tp.FLOAT, ["batch", None, TOY.d_model]) for n in outs[1:]]
    w = _toy_weights()
    inits = [helper.make_tensor("table", tp.FLOAT, list(w["table"].shape), w["table"].flatten().tolist()),
             helper.make_tensor("w", tp.FLOAT, list(w["w"].shape), w["w"].flatten().tolist()),
             helper.make_tensor("bias", tp.FLOAT, [TOY.n_token], w[graph].tolist()),
             helper.make_tensor("last", tp.INT64, [], [-1]), helper.make_tensor("axis1", tp.INT64, [1], [1])]
    nodes = [helper.make_node("Gather", ["table", ins[0]], ["e"]),
             helper.make_node("Gather", ["e", "last"], ["e_last"], axis=1),
             helper.make_node("ReduceSum", [ins[1], "axis1"], ["mem_sum"], keepdims=0),
             helper.make_node("Add", ["e_last", "mem_sum"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["hw"]),
             helper.make_node("Add", ["hw", "bias"], ["logits"]),
             helper.make_node("LogSoftmax", ["logits"], [outs[0]], axis=-1)]
    for i, (mem, new) in enumerate(zip(ins[1:], outs[1:])):
        inits.append(helper.make_tensor(f"scale_{i}", tp.FLOAT, [], [float(i + 1)]))
        nodes += [helper.make_node("Mul", ["e", f"scale_{i}"], [f"e_{i}"]),
                  helper.make_node("Concat", [mem, f"e_{i}"], [new], axis=1)]
    outputs.reverse()  # declared in another order than the exporter's: outputs are asked for by name
    return helper.make_model(helper.make_graph(nodes, graph, inputs, outputs, inits),
                             opset_imports=[helper.make_opsetid("", OPSET)])


def toy_export(directory: Path) -> Path:
    """An export directory of the toy graphs, as ``export_onnx`` lays one out."""
    directory.mkdir(parents=True)
    for name, file in GRAPHS.items():
        onnx.save(_toy_graph(name), str(directory / file))
    (directory / "config.json").write_text(TOY.to_json())
    (directory / EXPORT_JSON).write_text(json.dumps({"format": FORMAT}))
    write_manifest(directory)
    return directory


@pytest.fixture
def toy(tmp_path) -> Path:
    return toy_export(tmp_path / "toy")


@pytest.mark.parametrize(("batch", "qlen", "mlen", "mem_len"), [
    (2, 3, 0, 2), (1, 1, 4, 3), (3, 1, 0, 5), (2, 2, 3, 9), (1, 4, 2, 0), (2, 1, 2, 3)])
def test_advance_runs_the_graph_of_its_segment_and_keeps_the_last_mem_len_positions(toy, batch, qlen, mlen,
                                                                                     mem_len) -> None:
    """One token runs the step graph, more the segment graph; the new memories are the last ``mem_len`` positions
    of each ``new_mem_i`` (all of them when there are fewer). Ids of any integer type and memories of any float
    type and layout are accepted."""
    lm = OnnxRuntimeLM(toy)
    torch.manual_seed(batch * 100 + qlen * 10 + mlen)
    ids = torch.randint(0, TOY.n_token, (batch, qlen), dtype=torch.int32)
    mems = [torch.randn(mlen, batch, TOY.d_model, dtype=torch.float64).transpose(0, 1) for _ in range(2)]
    log_probs, new = lm.advance(ids, mems, mem_len=mem_len)
    want, full = toy_reference("step" if qlen == 1 else "segment", ids.long(), [m.float() for m in mems])
    torch.testing.assert_close(log_probs, want)
    assert len(new) == len(full) == TOY.n_layer + 1
    for got, whole in zip(new, full):
        assert got.shape == (batch, min(mem_len, mlen + qlen), TOY.d_model)
        torch.testing.assert_close(got, whole[:, whole.size(1) - got.size(1):])


@pytest.mark.parametrize("mems", [None, []])
def test_advance_without_memories_starts_a_text(toy, mems) -> None:
    lm = OnnxRuntimeLM(toy)
    assert [m.shape for m in lm.empty_mems(3)] == [(3, 0, TOY.d_model)] * (TOY.n_layer + 1)
    ids = torch.tensor([[1, 4], [0, 2], [3, 3]])
    log_probs, new = lm.advance(ids, mems, mem_len=5)
    want, full = toy_reference("segment", ids, lm.empty_mems(3))
    torch.testing.assert_close(log_probs, want)
    for got, whole in zip(new, full):
        torch.testing.assert_close(got, whole)


@pytest.mark.parametrize(("ids", "mems", "message"), [
    (torch.tensor([1, 2]), None, "input_ids must be [batch, time] with at least one token, got (2,)"),
    (torch.zeros(2, 0, dtype=torch.long), None, "input_ids must be [batch, time] with at least one token, got (2, 0)"),
    (torch.tensor([[1]]), [torch.zeros(1, 0, 3)], "expected 2 memory tensors, got 1"),
    (torch.tensor([[1]]), [torch.zeros(1, 0, 3)] * 3, "expected 2 memory tensors, got 3")])
def test_advance_refuses_what_the_graphs_cannot_read(toy, ids, mems, message) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        OnnxRuntimeLM(toy).advance(ids, mems, mem_len=2)


def test_a_recurrence_carries_the_memories_over_segments(toy) -> None:
    """``next_log_probs`` reads its segments in order, each after the memories the last one left (cut to
    ``mem_len``), from the memories it was given; with no segment it refuses in one line."""
    lm = OnnxRuntimeLM(toy)
    start = [torch.randn(1, 1, TOY.d_model) for _ in range(2)]
    rec = OnnxRecurrence(lm, TOY.lengths(mem_len=3), mems=start)
    segments = [torch.tensor([[1, 2]]), torch.tensor([[3]]), torch.tensor([[4, 0, 1]])]
    got = rec.next_log_probs(iter(segments))
    mems = start
    for x in segments:
        want, mems = lm.advance(x, mems, mem_len=3)
    torch.testing.assert_close(got, want)
    for a, b in zip(rec.mems, mems):
        torch.testing.assert_close(a, b)
    assert OnnxRecurrence(lm, TOY.lengths()).mems == []
    with pytest.raises(ConfigError, match=r"^no segment to read$"):
        OnnxRecurrence(lm, TOY.lengths()).next_log_probs([])


@pytest.mark.parametrize("changes", [dict(clamp_len=2), dict(same_length=True), dict(clamp_len=-1)])
def test_settings_fixed_in_the_graphs_are_refused(toy, changes) -> None:
    lm = OnnxRuntimeLM(toy)
    with pytest.raises(ConfigError, match=r"^the ONNX graphs were exported with clamp_len 4 and same_length False; "
                                          r"these are fixed in them \(export again to change them\)$"):
        OnnxRecurrence(lm, TOY.lengths(**changes))
    with pytest.raises(ConfigError, match="captured"):
        generate(lm, [1, 2], max_new_tokens=2, captured=True)


def test_onnx_runtime_uses_the_threads_asked_for_on_the_cpu_silently(toy, capfd) -> None:
    """``threads`` intra-op threads, by default torch's thread count (as the PyTorch backend); the CPU provider
    only, asked for by its name (ONNX Runtime names an unknown one on the console, warns and falls back)."""
    torch.set_num_threads(2)  # the suite's per-test setting is restored after the test
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = [(OnnxRuntimeLM(toy, threads=3), 3), (OnnxRuntimeLM(toy), 2)]
    for lm, want in made:
        for session in lm.sessions.values():
            assert session.get_session_options().intra_op_num_threads == want
            assert session.get_providers() == ["CPUExecutionProvider"]
    assert capfd.readouterr() == ("", "")


def test_a_missing_onnxruntime_is_named_with_the_extra(toy, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ConfigError, match=r"^the onnxruntime backend needs the onnx extra \(onnxruntime is missing\): "
                                          r"pip install -e '\.\[onnx\]' in the txl checkout \(or its wheel with the "
                                          r"extra: 'transformer_xl-VERSION-py3-none-any.whl\[onnx\]'\)$"):
        OnnxRuntimeLM(toy)


def test_a_missing_incomplete_or_corrupt_export_is_refused_in_one_line(toy, tmp_path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(TOY.to_json())
    assert is_export_dir(toy) and not is_export_dir(model_dir) and not is_export_dir(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=f"^ONNX export directory not found: {re.escape(str(tmp_path))}/nowhere$"):
        OnnxRuntimeLM(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(model_dir))} is not an ONNX export \(no "
                                              r"onnx_export\.json; make one with txl export onnx MODEL DIR\)$"):
        OnnxRuntimeLM(model_dir)
    broken = tmp_path / "broken"
    shutil.copytree(toy, broken)
    damage_file(broken / "step.onnx", "bit-flip")
    with pytest.raises(CheckpointError, match=r"step\.onnx does not match its SHA-256") as exc:
        OnnxRuntimeLM(broken)
    assert "\n" not in str(exc.value)
    (broken / "step.onnx").write_bytes(b"not a graph")  # unchecked: ONNX Runtime itself refuses it
    with pytest.raises(CheckpointError, match=rf"^ONNX Runtime cannot load {re.escape(str(broken))}/step\.onnx: "
                                              r"\[ONNXRuntimeError\] : 7 : INVALID_PROTOBUF : .*Protobuf parsing "
                                              r"failed\.$") as exc:
        OnnxRuntimeLM(broken, verify=False)
    assert "\n" not in str(exc.value)
    (broken / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match=r"is not a complete ONNX export \(no MANIFEST\.json\)$"):
        OnnxRuntimeLM(broken)
    shutil.copyfile(toy / "step.onnx", broken / "step.onnx")
    OnnxRuntimeLM(broken, verify=False)  # whole again, no manifest asked for
    (broken / EXPORT_JSON).write_text(json.dumps({"format": "txl-onnx-0"}))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(broken))}/onnx_export\.json has format "
                                              r"'txl-onnx-0'; this txl reads 'txl-onnx-1' \(export the model again\)$"):
        OnnxRuntimeLM(broken, verify=False)
    (broken / EXPORT_JSON).write_text("[1]")
    with pytest.raises(CheckpointError, match="JSON must be an object"):
        OnnxRuntimeLM(broken, verify=False)
    (broken / EXPORT_JSON).write_text(json.dumps({"format": FORMAT}))
    (broken / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        OnnxRuntimeLM(broken, verify=False)


def test_the_manifest_must_list_every_file_txl_reads(toy) -> None:
    """Each graph, onnx_export.json and config.json, and vocab.json and the tokenizer when the directory holds them:
    one the manifest omits (added or replaced after the export, so unchecked) is refused in one line."""
    for name in (*GRAPHS.values(), EXPORT_JSON, "config.json"):
        write_manifest(toy, [n for n in (*GRAPHS.values(), EXPORT_JSON, "config.json") if n != name])
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(toy))}/MANIFEST\.json does not list "
                                                  rf"{re.escape(name)}, which txl reads from the export \(a file added "
                                                  r"or replaced after the export\): export the model again$"):
            OnnxRuntimeLM(toy)
        OnnxRuntimeLM(toy, verify=False)  # --no-verify: not asked
    write_manifest(toy)
    (toy / "vocab.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"does not list vocab\.json"):
        OnnxRuntimeLM(toy)
    write_manifest(toy)
    OnnxRuntimeLM(toy)
    (toy / EXPORT_JSON).write_text(json.dumps({"format": FORMAT, "text": {"tokenizer": "tokenizer.json"}}))
    (toy / "tokenizer.json").write_text("{}")
    write_manifest(toy, [*GRAPHS.values(), EXPORT_JSON, "config.json", "vocab.json"])
    with pytest.raises(CheckpointError, match=r"does not list tokenizer\.json"):
        OnnxRuntimeLM(toy)
    (toy / EXPORT_JSON).write_text(json.dumps({"format": FORMAT, "text": {"tokenizer": "../tok.json"}}))
    write_manifest(toy)
    with pytest.raises(CheckpointError, match=r"names '\.\./tok\.json', not a plain file name"):
        OnnxRuntimeLM(toy, verify=False)


def test_graphs_that_are_not_this_exports_are_refused_even_unverified(toy, tmp_path) -> None:
    """The two graphs swapped (the segment graph then reads one token only), or a graph of another model (another
    number of memories, another d_model): one line before anything runs, with or without the manifest's check."""
    swapped = tmp_path / "swapped"
    shutil.copytree(toy, swapped)
    (swapped / "segment.onnx").write_bytes((toy / "step.onnx").read_bytes())
    (swapped / "step.onnx").write_bytes((toy / "segment.onnx").read_bytes())
    write_manifest(swapped)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(swapped))}/segment\.onnx is not this export's "
                                              r"segment graph: its inputs have the shapes .*; export the model "
                                              r"again$") as exc:
        OnnxRuntimeLM(swapped)
    assert "\n" not in str(exc.value)
    other = tmp_path / "other"
    shutil.copytree(toy, other)
    (other / "config.json").write_text(tiny_config(**{**TOY.to_dict(), "n_layer": 2}).to_json())
    with pytest.raises(CheckpointError, match=r"segment\.onnx is not this export's segment graph: it takes "
                                              r"\['input_ids', 'mem_0', 'mem_1'\] and gives .* needs \['input_ids', "
                                              r"'mem_0', 'mem_1', 'mem_2'\]"):
        OnnxRuntimeLM(other, verify=False)
    (other / "config.json").write_text(tiny_config(**{**TOY.to_dict(), "d_model": 8, "d_head": 8}).to_json())
    with pytest.raises(CheckpointError, match=r"segment\.onnx is not this export's segment graph: .* memories "
                                              r"\[batch, mem, 8\]"):
        OnnxRuntimeLM(other, verify=False)


def test_a_graph_that_fails_as_it_runs_is_a_one_line_error(toy) -> None:
    """A graph that loads, has the export's inputs and outputs, and fails inside ONNX Runtime (here: its embedding
    table is shorter than the vocabulary) is a one-line :class:`CheckpointError` naming the graph, no traceback of
    ONNX Runtime's; ids and memories the graph cannot read are refused before it runs."""
    graph = _toy_graph("step")
    table = next(t for t in graph.graph.initializer if t.name == "table")
    table.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(table)[:2], "table"))
    onnx.save(graph, str(toy / "step.onnx"))
    write_manifest(toy)
    lm = OnnxRuntimeLM(toy)
    lm.advance(torch.tensor([[1]]), None, mem_len=2)  # a row the table has
    with pytest.raises(CheckpointError, match=rf"^ONNX Runtime failed running {re.escape(str(toy))}/step\.onnx: "
                                              r"\[ONNXRuntimeError\] .* \(export the model again\)$") as exc:
        lm.advance(torch.tensor([[4]]), None, mem_len=2)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"^token ids must lie in \[0, 5\), got 1\.\.5$"):
        lm.advance(torch.tensor([[1, 5]]), None, mem_len=2)
    with pytest.raises(ConfigError, match=r"^token ids must lie in \[0, 5\), got -1\.\.1$"):
        lm.advance(torch.tensor([[-1, 1]]), None, mem_len=2)
    for mems, shape in (([torch.zeros(1, 2, 3), torch.zeros(1, 2, 4)], (1, 2, 3)),
                        ([torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)], (2, 2, 4)),
                        ([torch.zeros(1, 2, 4), torch.zeros(1, 3, 4)], (1, 2, 4)),
                        ([torch.zeros(1, 4), torch.zeros(1, 2, 4)], (1, 4))):
        with pytest.raises(ConfigError, match=rf"^memory 0 must be \[batch 1, positions, d_model 4\] like the "
                                              rf"others, got {re.escape(str(shape))}$"):
            lm.advance(torch.tensor([[1]]), mems, mem_len=2)


# --------------------------------------------------------------------- a real export of a model (session's export)
@pytest.mark.parametrize("qlen", [1, 4])
def test_advance_equals_the_model_and_keeps_the_last_mem_len_positions(onnx_export, qlen) -> None:
    model, _, export = onnx_export()
    lm = OnnxRuntimeLM(export)
    cfg = model.config
    torch.manual_seed(qlen)
    mems = [torch.randn(2, 5, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    ids = torch.randint(0, cfg.n_token, (2, qlen))
    log_probs, new = lm.advance(ids, mems, mem_len=3)
    with torch.no_grad():
        out = model(ids, None, mems, lengths=cfg.lengths(mem_len=3))
    torch.testing.assert_close(log_probs, model.log_prob(out.hidden[:, -1]), atol=1e-5, rtol=1e-5)
    assert [m.shape for m in new] == [m.shape for m in out.mems] == [(2, 3, cfg.d_model)] * (cfg.n_layer + 1)
    for got, want in zip(new, out.mems):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [
    dict(), dict(mem_len=3), dict(do_sample=True, seed=5, top_k=6, temperature=0.8),
    dict(do_sample=True, seed=1, top_p=0.7, repetition_penalty=1.5, no_repeat_ngram_size=2),
    dict(stop_token_ids=[0, 3], pad_token_id=19)])
def test_generation_on_onnx_runtime_equals_pytorch(onnx_export, options) -> None:
    model, _, export = onnx_export()
    lm = OnnxRuntimeLM(export)
    ids = torch.randint(0, model.config.n_token, (3, 13), generator=torch.Generator().manual_seed(0))
    want = generate(model, ids, max_new_tokens=25, **options)
    got = generate(lm, ids, max_new_tokens=25, **options)
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(got.log_probs, want.log_probs, atol=1e-4, rtol=0)
    assert torch.equal(got.finished, want.finished)
    for g, w in zip(got.mems, want.mems):  # the memories of a generation continue as the model's do
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_generation_continues_from_its_memories(onnx_export) -> None:
    model, _, export = onnx_export()
    lm = OnnxRuntimeLM(export)
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 8]])
    first = generate(lm, ids, max_new_tokens=4)
    again = generate(lm, first.sequences[:, -1:], mems=first.mems, max_new_tokens=4)
    whole = generate(model, ids, max_new_tokens=7)
    assert torch.equal(torch.cat([first.new_tokens, again.new_tokens[:, :3]], 1), whole.new_tokens)
