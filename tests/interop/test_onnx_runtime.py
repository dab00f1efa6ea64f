"""ONNX Runtime over an export: advance equals the model's forward; generation equals the PyTorch backend's; a
missing, incomplete or corrupt export is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers import damage_file
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.inference.generate import generate
from transformer_xl.interop.onnx_export import EXPORT_JSON
from transformer_xl.interop.onnx_runtime import OnnxRecurrence, OnnxRuntimeLM, is_export_dir

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("qlen", [1, 4])
def test_advance_equals_the_model_and_keeps_the_last_mem_len_positions(onnx_export, qlen) -> None:
    model, _, export = onnx_export
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
    model, _, export = onnx_export
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
    model, _, export = onnx_export
    lm = OnnxRuntimeLM(export)
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 8]])
    first = generate(lm, ids, max_new_tokens=4)
    again = generate(lm, first.sequences[:, -1:], mems=first.mems, max_new_tokens=4)
    whole = generate(model, ids, max_new_tokens=7)
    assert torch.equal(torch.cat([first.new_tokens, again.new_tokens[:, :3]], 1), whole.new_tokens)


def test_settings_fixed_in_the_graphs_are_refused(onnx_export) -> None:
    model, _, export = onnx_export
    lm = OnnxRuntimeLM(export)
    with pytest.raises(ConfigError, match="clamp_len"):
        OnnxRecurrence(lm, model.config.lengths(clamp_len=2))
    with pytest.raises(ConfigError, match="captured"):
        generate(lm, [1, 2], max_new_tokens=2, captured=True)


def test_a_missing_incomplete_or_corrupt_export_is_refused_in_one_line(onnx_export, tmp_path) -> None:
    _, model_dir, export = onnx_export
    assert is_export_dir(export) and not is_export_dir(model_dir)
    with pytest.raises(CheckpointError, match="not found"):
        OnnxRuntimeLM(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="is not an ONNX export"):
        OnnxRuntimeLM(model_dir)
    broken = tmp_path / "broken"
    shutil.copytree(export, broken)
    damage_file(broken / "step.onnx", "bit-flip")
    with pytest.raises(CheckpointError, match="SHA-256") as exc:
        OnnxRuntimeLM(broken)
    assert "\n" not in str(exc.value)
    (broken / "step.onnx").write_bytes(b"not a graph")  # unchecked: ONNX Runtime itself refuses it
    with pytest.raises(CheckpointError, match="ONNX Runtime cannot load") as exc:
        OnnxRuntimeLM(broken, verify=False)
    assert "\n" not in str(exc.value)
    (broken / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="MANIFEST"):
        OnnxRuntimeLM(broken)
    doc = json.loads((export / EXPORT_JSON).read_text())
    (broken / EXPORT_JSON).write_text(json.dumps({**doc, "format": "txl-onnx-0"}))
    with pytest.raises(CheckpointError, match="format"):
        OnnxRuntimeLM(broken, verify=False)
