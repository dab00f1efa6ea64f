"""txl bench generate: txl vs Hugging Face's loop vs int8 vs the measured bandwidth limit, on a tiny shape."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.cli import main
from transformer_xl.experiments.bench import generate as G
from transformer_xl.interop.hf import hf_available
from transformer_xl.train.precision import CPU_CLASSES, device_description

TINY = dict(n_token=50, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=5, mem_len=8,
            cutoffs=[20], init_std=0.3)


@pytest.fixture
def tiny_shape(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(G.SHAPES, "tiny", lambda: TXLConfig(**TINY))
    monkeypatch.setattr(G, "read_rate", functools.partial(G.read_rate, nbytes=2**16))  # structure, not speed
    return "tiny"


def test_smoke_a_case_times_every_decoder_and_the_limit(tiny_shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the captured step run eagerly here (its compiled graph is tested in tests/inference/test_captured.py)
    monkeypatch.setattr(G, "CapturedDecoder", functools.partial(G.CapturedDecoder, compile=False))
    opts = G.GenerateBenchOptions(shapes=[tiny_shape], mem_lens=[12], batches=[2], new_tokens=5, hf_tokens=3,
                                  repeats=2)
    lines: list[str] = []
    calls = {"prefill": 0}
    stream = G.stream

    def counting(model, ids, **kw):
        calls["prefill"] += "mems" not in kw
        return stream(model, ids, **kw)

    monkeypatch.setattr(G, "stream", counting)
    report = G.run_generate_bench(opts, log=lines.append)
    (row,) = report["rows"]
    assert row["tok_per_s"]["txl"] > 0 and row["tok_per_s"]["txl-int8"] > 0 and len(row["rounds"]["txl"]) == 2
    # every txl decoder's share of the limit its own bytes give at the run's read rate
    rate = row["read_rate_bytes_per_s"]  # the best of the run's first measurement and one after the case
    assert rate >= report["read_rate"]["bytes_per_s"]
    assert set(row["share"]) == {"txl", "txl-int8", "captured", "captured-int8"} and "hf" not in row["step_bytes"]
    for name, nbytes in row["step_bytes"].items():
        assert row["share"][name] == pytest.approx(row["tok_per_s"][name] * nbytes / (2 * rate))
    # int8 weights and a bf16 ring: fewer bytes than the fp32 captured step
    assert row["step_bytes"]["captured-int8"] < row["step_bytes"]["captured"]
    assert row["kernel_bytes_per_s"]["linear_chain"] > 0 and report["env"]["cpu"] == report["machine"]
    assert len(lines) == 2 + 2 * len(row["rounds"]) and lines[1].startswith("read rate")
    assert lines[0] == device_description("cpu") and lines[0].endswith(" kernels)")  # the CPU, its flags and class
    assert f"{CPU_CLASSES[report['env']['cpu_class']]} kernels; load average" in G.to_markdown(report, "txl bench")
    # the prompt read once per model (fp32, int8) for all rounds, once per captured decoder (its compile), and by
    # the prefill timing (2 repeats)
    assert calls["prefill"] == 2 + 2 + 2
    # the captured steps: the plain step's greedy tokens (fp32), their shares of the same limit, the prefill
    assert row["tok_per_s"]["captured"] > 0 and row["tok_per_s"]["captured-int8"] > 0
    # 2 rows x (the prompt's token, the plain step's, 5 timed steps)
    assert row["captured_same_tokens"] == "14/14" and row["kv_dtype"] == "bfloat16"
    pre = row["prefill"]
    assert pre["tok_per_s"] > 0 and 0 < pre["share_of_compute"] == pytest.approx(pre["flop_per_s"] / pre[
        "peak_flop_per_s"])
    table = G.to_markdown(report, "txl bench generate --shapes tiny")
    assert "`txl bench generate --shapes tiny`" in table and "| tiny | 12 | 2 |" in table
    assert "| tiny | 12 | 2 | captured step, int8 weights |" in table and "prefill tok/s" in table


@pytest.mark.hf4
def test_the_same_greedy_tokens_as_hugging_faces_loop(tiny_shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hugging Face's TransfoXL (transformers 4, make test-hf4) from the same weights and an empty memory."""
    pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
    assert hf_available()
    monkeypatch.setattr(G, "CapturedDecoder", functools.partial(G.CapturedDecoder, compile=False))
    opts = G.GenerateBenchOptions(shapes=[tiny_shape], mem_lens=[12], batches=[2], new_tokens=5, hf_tokens=3,
                                  repeats=1)
    (row,) = G.run_generate_bench(opts, log=lambda line: None)["rows"]
    assert row["hf_same_tokens"] == "8/8" and row["txl_over_hf"] > 0


def test_prefill_flops_count_the_blocks_once_per_position() -> None:
    cfg = TXLConfig(**TINY)
    one = G.prefill_flops(cfg, batch=1, prompt_len=5)  # one segment, no memory
    assert G.prefill_flops(cfg, batch=3, prompt_len=5) == 3 * one  # W_kR R comes from the inference cache
    # a second segment attends over the first: more than twice the first
    assert G.prefill_flops(cfg, batch=1, prompt_len=10) > 2 * one


def test_step_weights_are_every_matrix_a_step_reads() -> None:
    model = TransformerXLLM(TXLConfig(**TINY))
    mats = G.step_weights(model)
    names = {id(p): n for n, p in model.named_parameters()}
    read = {names[id(m)] for m in mats}
    assert "layers.0.dec_attn.qkv_net.weight" in read and "layers.1.pos_ff.CoreNet.3.weight" in read
    assert "word_emb.emb_layers.0.weight" in read and "crit.cluster_weight" in read  # the output (tied) matrix
    assert not any("r_net" in n for n in read)  # a step reads the table of position keys instead
    assert len(mats) == len({id(m) for m in mats})  # the tied embedding is counted once


def test_cli_bench_generate_writes_json_and_markdown(tiny_shape: str, tmp_path, capsys, monkeypatch) -> None:
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):  # (make test-avx2 sets them)
        monkeypatch.delenv(name, raising=False)
    out, md = tmp_path / "g.json", tmp_path / "g.md"
    argv = ["bench", "generate", "--shapes", tiny_shape, "--mem-lens", "6", "--batches", "1", "--new-tokens", "3",
            "--hf-tokens", "2", "--repeats", "1", "--no-hf", "--no-captured", "--no-prefill", "--json", str(out),
            "--markdown", str(md)]
    monkeypatch.setattr("sys.argv", ["txl", *argv])
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("txl bench generate") and doc["rows"][0]["mem_len"] == 6
    assert "hf" not in doc["rows"][0]["tok_per_s"] and "| tiny | 6 | 1 |" in md.read_text()
    assert main(["bench", "generate", "--shapes", "nope", "--no-hf"]) == 2
    assert "unknown shape 'nope'" in capsys.readouterr().err
    for flag in ("--batches", "--mem-lens"):  # refused before any model is built
        assert main(["bench", "generate", "--shapes", tiny_shape, flag, "0", "--no-hf"]) == 2
        assert f"{flag} values must be >= 1, got 0" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "generate", "--shapes", tiny_shape, "--device", "cuda"]) == 2


def test_a_decoder_faster_than_its_byte_limit_is_refused(tiny_shape: str, tmp_path, capsys, monkeypatch) -> None:
    """A read rate the step beats (a wrong yardstick): one line naming the case and decoder, no table, no JSON."""
    monkeypatch.setattr(G, "read_rate", lambda device: {"bytes_per_s": 1.0, "buffer_bytes": 4, "passes": 1,
                                                        "method": "stub"})
    out = tmp_path / "g.json"
    argv = ["bench", "generate", "--shapes", tiny_shape, "--mem-lens", "6", "--batches", "1", "--new-tokens", "2",
            "--repeats", "1", "--no-hf", "--no-int8", "--no-captured", "--no-prefill", "--json", str(out)]
    assert main(argv) != 0
    captured = capsys.readouterr()
    assert "tiny mem_len 6 batch 1 txl:" in captured.err and "above 100 %" in captured.err
    assert "| tiny |" not in captured.out and not out.exists()
