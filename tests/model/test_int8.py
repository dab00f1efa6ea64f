"""int8 weights for CPU inference (TransformerXLLM.quantize): the layer is the kernel on int8 rows and their scales,
the plain model equals the captured int8 step, close to float, inference only, refused clearly, off torch.ao."""

from __future__ import annotations

import ast
import json
import shutil
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import REPO, generation_model
from transformer_xl import InferenceCache, Recurrence, TransformerXLLM, TXLConfig
from transformer_xl.errors import ConfigError
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.inference.generate import generate, reference_generate
from transformer_xl.inference.packing import unblock_rows
from transformer_xl.model import native
from transformer_xl.model.int8 import BLOCK, Int8Linear, int8_matmul, is_quantized, quantize_linears, quantize_rows

V = 60


def _model(**kw) -> TransformerXLLM:
    base = dict(n_token=V, n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, tgt_len=6, mem_len=8,
                init_std=0.1)
    torch.manual_seed(0)
    return TransformerXLLM(TXLConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("kw", [
    dict(), dict(cutoffs=[20, 40], div_val=1), dict(cutoffs=[20, 40], div_val=2, d_embed=32),
    dict(cutoffs=[20], d_embed=16, tie_projs=[False, True]), dict(pre_lnorm=True, untie_r=True, same_length=True),
    dict(attn_type=1), dict(attn_type=2), dict(attn_type=3), dict(sample_softmax=10),
])
def test_int8_log_probs_are_close_to_float(kw: dict) -> None:
    model = _model(**kw)
    quant = _model(**kw).quantize("int8")
    assert quant.quantized == "int8" and not quant.training
    qlinears = [m for m in quant.modules() if is_quantized(m)]
    assert len(qlinears) >= 4 * model.config.n_layer  # qkv, o, both feed-forward layers of every block
    x = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(1))
    rec_f, rec_q = Recurrence(model), Recurrence(quant)
    with torch.no_grad():
        for _ in range(3):
            lp_f = rec_f(x, return_log_probs=True).log_probs
            lp_q = rec_q(x, return_log_probs=True).log_probs
            diff = (lp_q - lp_f).abs().max().item()
            assert 0 < diff < 0.05  # int8 rows and bf16 rounding: different, and close (measured <= 0.02 here;
            # a wrong weight or scale gives errors of order 1)
            torch.testing.assert_close(lp_q.exp().sum(-1), torch.ones(3, 6))  # still a distribution


def test_int8_generation_matches_its_own_plain_path_and_mostly_float() -> None:
    model = _model(cutoffs=[20, 40])
    quant = _model(cutoffs=[20, 40]).quantize("int8")
    prompt = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    a = generate(quant, prompt, max_new_tokens=30, mem_len=12)
    # The plain path: every step replayed from empty memories without the inference cache, int8 weights too.
    plain_ids, plain_lp = reference_generate(quant, prompt, 30, mode="replay", mem_len=12)
    assert torch.equal(a.new_tokens, plain_ids)
    # Weight-only int8 (the input is not quantized): the cache, which projects only the new positions, gives the
    # values of the plain path, which projects all of them, to float rounding.
    torch.testing.assert_close(a.log_probs, plain_lp, atol=1e-5, rtol=0)
    b = generate(model, prompt, max_new_tokens=30, mem_len=12)
    float_ids, float_lp = reference_generate(model, prompt, 30, mode="replay", mem_len=12)
    assert not torch.allclose(plain_lp, float_lp, atol=1e-6)  # the plain path really ran the int8 weights
    assert (a.new_tokens == b.new_tokens).float().mean() > 0.8 and torch.equal(b.new_tokens, float_ids)


def test_a_cache_made_before_quantizing_is_not_reused() -> None:
    model = _model()
    x = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(3))
    cache = InferenceCache()
    with torch.no_grad():
        mems = model(x, mems=None, cache=cache).mems
        model.quantize("int8")
        served = model(x, x, mems, cache=cache).nll
        torch.testing.assert_close(served, model(x, x, mems).nll)  # projected by the int8 weights


def test_a_quantized_model_does_not_train_save_or_quantize_again(tmp_path) -> None:
    model = _model().quantize("int8")
    with pytest.raises(ConfigError, match="inference only"):
        model.train()
    with pytest.raises(ConfigError, match="not saved"):
        model.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()
    with pytest.raises(ConfigError, match="already quantized"):
        model.quantize("int8")
    with pytest.raises(ConfigError, match="unknown quantization 'int4'"):
        _model().quantize("int4")
    meta = _model().to("meta")
    with pytest.raises(ConfigError) as info:
        meta.quantize("int8")
    assert str(info.value) == ("int8 quantization is for CPU inference; the model is on meta (move it with .cpu() "
                               "first, or keep float weights on an accelerator)")


def test_a_torch_without_the_int8_kernel_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(torch.ops, "aten", types.SimpleNamespace())  # a build without aten._weight_int8pack_mm
    with pytest.raises(ConfigError) as info:
        _model().quantize("int8")
    assert str(info.value) == (f"this torch ({torch.__version__}) has no int8 kernel (aten._weight_int8pack_mm): "
                               "int8 inference is not available; use float weights")


# ---------------------------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("shape", [(7, 41), (24, 32), (130, 410)])
def test_the_layer_is_the_float_map_to_int8_rounding(shape) -> None:
    """Output = x W^T + b within the error of int8 rows (half a scale per weight) and bf16 rounding; a wrong or
    missing scale (a factor ~ max|W| / 127 per row) is off by orders of magnitude."""
    out, inp = shape
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out, inp, generator=g) * torch.linspace(0.01, 3.0, out)[:, None]  # rows of very different size
    b, x = torch.randn(out, generator=g), torch.randn(5, 3, inp, generator=g)
    lin = Int8Linear(w, b)
    assert lin.weight.dtype == torch.int8 and lin.scale.dtype == torch.bfloat16 and lin.weight.shape[1] % BLOCK == 0
    assert lin.scale.shape == (out,) and not lin.weight[:, inp:].any()  # one scale per row, zero padding
    y, ref = lin(x), F.linear(x, w, b)
    assert y.shape == ref.shape == (5, 3, out) and y.dtype == x.dtype
    # per output: sum |x| times half a scale from the int8 rounding, plus the bf16 rounding of input and result
    bound = x.abs().sum(-1, keepdim=True) * lin.scale.float() / 2 + (ref.abs() + x.abs() @ w.abs().T) / 2**7
    assert ((y - ref).abs() <= bound).all()
    assert (y - ref).abs().max() > 0  # it really ran int8


def test_the_layer_multiplies_the_int8_rows_by_their_scales() -> None:
    """The kernel's result is the product with ``q * scale``: exact up to the bf16 rounding of the result."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(20, 48, generator=g), torch.randn(4, 48, generator=g).bfloat16().float()
    q, scale = quantize_rows(w)
    assert q.abs().max() == 127 and (q.float() * scale.float()[:, None] - w).abs().max() <= scale.float().max() / 2
    exact = x.double() @ (q.double() * scale.double()[:, None]).T  # [4, 20]
    torch.testing.assert_close(int8_matmul(x, q, scale).double(), exact, rtol=2**-8, atol=1e-6)


def test_no_row_needs_clipping() -> None:
    """The largest ``|W / s|`` before rounding is 127.4961 (the bf16 scale rounded down by at most 1/257 of itself):
    every row maximum of a binade, 1/8 of its float32 values (which binade does not matter), rounds to 127 and
    gives back its row maximum to within half a scale; zero rows give zeros."""
    m = 1.0 + torch.arange(0, 2**23, 8, dtype=torch.float32) / 2**23  # [2^20] row maxima in [1, 2)
    w = torch.stack([m, -m, m / 3], 1)  # [2^20, 3]: the maximum of either sign, and a smaller weight
    q, scale = quantize_rows(w)
    assert q[:, 0].eq(127).all() and q[:, 1].eq(-127).all() and not q[:, 3:].any()
    assert ((q[:, :3].float() * scale.float()[:, None] - w).abs() <= scale.float()[:, None] / 2).all()
    assert (w / scale.float()[:, None]).abs().max() < 127.5
    q0, s0 = quantize_rows(torch.zeros(2, 16))
    assert not q0.any() and (s0 > 0).all()


def test_the_layer_reads_as_a_linear_layer() -> None:
    with_bias = Int8Linear(torch.randn(7, 41), torch.zeros(7))
    assert repr(with_bias) == "Int8Linear(in_features=41, out_features=7, bias=True)"
    assert repr(Int8Linear(torch.randn(3, 16))) == "Int8Linear(in_features=16, out_features=3, bias=False)"


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_of_the_layer_equal_its_whole_output_sliced(threads) -> None:
    """project_rows multiplies by a slice of the rows: bit for bit what the whole layer gives for those rows."""
    lin = Int8Linear(torch.randn(3 * 40, 40), None)
    x = torch.randn(2, 9, 40)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = lin(x)
        for rows in (slice(0, 40), slice(40, 120), slice(7, 33)):
            assert torch.equal(lin.rows(x, rows), whole[..., rows])
    finally:
        torch.set_num_threads(before)


def test_quantize_linears_takes_linear_layers_only() -> None:
    holder = torch.nn.ModuleDict({"a": torch.nn.Linear(16, 8), "n": torch.nn.LayerNorm(8)})
    quantize_linears(holder, ["a"])
    assert isinstance(holder["a"], Int8Linear) and holder["a"].bias is not None
    with pytest.raises(ConfigError, match="n is a LayerNorm, not a linear layer"):
        quantize_linears(holder, ["n"])


# ---------------------------------------------------------------------------------------------- one int8 path
@pytest.mark.parametrize("products", ["compiled", "native"])
@pytest.mark.parametrize("overrides", [{}, {"cutoffs": [10, 25]}, {"pre_lnorm": True, "untie_r": True}])
def test_the_plain_int8_model_and_the_captured_int8_step_share_their_int8_numbers(overrides, products) -> None:
    """One int8 scheme: the quantized model's layers and the captured int8 step hold the same int8 numbers and bf16
    scales (each multiplies by them with its own kernel: the plain one rounds its input to bf16, the captured one
    does not or, with txl's kernels, quantizes it per row, tests/inference/test_captured.py), and both are int8 (far
    from float)."""
    if products == "native" and (why := native.unavailable()):
        pytest.skip(why)
    model = generation_model(0, n_token=40, **overrides)
    quant = generation_model(0, n_token=40, **overrides).quantize("int8")
    dec = CapturedDecoder(model, batch=2, mem_len=4, int8=True, compile=False, products=products)  # from the floats
    for layer, packed in zip(quant.layers, dec.weights["layers"]):
        for lin, name in ((layer.dec_attn.qkv_net, "qkv"), (layer.dec_attn.o_net, "o"),
                          (layer.pos_ff.CoreNet[0], "ff1"), (layer.pos_ff.CoreNet[3], "ff2")):
            got = packed[name]
            shape = (lin.out_features, lin.in_features)
            numbers = native.untile(got.weight, shape) if got.form == "tiles" else \
                unblock_rows(got.weight, lin.out_features)[:, :lin.in_features]
            assert is_quantized(lin) and torch.equal(numbers, lin.weight[:, :lin.in_features])
            assert torch.equal(got.scale.reshape(-1)[:lin.out_features], lin.scale.to(got.scale.dtype))
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(1))
    plain = generate(quant, ids, max_new_tokens=12, mem_len=4)
    cap = generate(model, ids, max_new_tokens=12, mem_len=4, captured=dec)
    flt = generate(model, ids, max_new_tokens=12, mem_len=4)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 0.03  # the plain kernel's bf16 input, through 12 steps
    assert (flt.log_probs - plain.log_probs).abs().max() > 1e-3 and (flt.log_probs - cap.log_probs).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------- off torch.ao
def test_no_source_module_uses_torch_ao_quantization() -> None:
    """int8 runs on aten's int8 kernel: nothing in the package imports or names the deprecated quantization API."""
    banned = ("torch.ao.quantization", "torch.quantization", "torch.ao.nn.quantized", "quantize_dynamic")
    found = []
    for path in sorted((REPO / "src" / "transformer_xl").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: import {n}" for n in names if n.startswith(("torch.ao", "torch.quantization"))]
        found += [f"{path.name}: {b}" for b in banned if b in text]
    assert not found


def test_quantizing_and_running_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quant = _model(cutoffs=[20, 40]).quantize("int8")
        with torch.no_grad():
            quant(torch.randint(0, V, (1, 4)))
    assert not [m for m in quant.modules() if type(m).__module__.startswith("torch.ao")]


# ---------------------------------------------------------------------------------------------- saved models
def test_a_model_saved_by_an_earlier_txl_loads_and_generates_its_int8_tokens(tmp_path, capsys) -> None:
    """``tests/assets/int8_saved``: a float model directory written by the txl before this int8 path (int8 was
    never saved: it is applied after loading), and what that txl's ``txl generate --quantize int8 --greedy
    --json`` printed for it (``int8.json``, and ``fp32.json`` without ``--quantize``). Loaded now with
    ``--quantize int8``: the same tokens, log-probabilities within 0.2 of the former int8 path's (which quantized
    the activations too, and was itself up to 0.16 from float here) and within 0.05 of float."""
    from transformer_xl.cli import main

    asset = REPO / "tests" / "assets" / "int8_saved"
    shutil.copytree(asset / "model", tmp_path / "model")
    before = json.loads((asset / "int8.json").read_text(encoding="utf-8"))["samples"][0]
    flt = json.loads((asset / "fp32.json").read_text(encoding="utf-8"))["samples"][0]
    assert main(["generate", str(tmp_path / "model"), "--prompt", "the game was", "--max-new-tokens", "24",
                 "--greedy", "--quantize", "int8", "--json"]) == 0
    now = json.loads(capsys.readouterr().out)["samples"][0]
    assert now["token_ids"] == before["token_ids"] == flt["token_ids"]
    lp_now, lp_before, lp_flt = (torch.tensor(s["log_probs"]) for s in (now, before, flt))
    assert (lp_now - lp_before).abs().max() <= 0.2 and (lp_now - lp_flt).abs().max() <= 0.05
    assert not torch.equal(lp_now, lp_flt)  # int8 weights, not float ones


def test_the_int8_probe_times_both_products_on_capped_shapes(monkeypatch) -> None:
    """float32 seconds over int8 seconds, at most PROBE_ROWS rows and PROBE_OUT outputs (milliseconds); the note
    only where int8 is slower."""
    from transformer_xl.model import int8

    shapes: list[tuple] = []
    monkeypatch.setattr(int8, "int8_matmul", lambda x, q, s: shapes.append((x.shape, q.shape)) or x)
    ratio = int8.int8_speedup(50_000, 48, 2000, reps=2)
    assert ratio > 0 and shapes == [((int8.PROBE_ROWS, 48), (int8.PROBE_OUT, 48))] * 3  # a warm-up and 2 timed
    assert int8.int8_note(1.0, 8) is None and int8.int8_note(2.1, 1) is None
    assert int8.int8_note(0.456, 64) == ("int8 weights measured 0.46x the speed of float32 on this CPU for products "
                                         "of 64 rows: --quantize int8 saves memory here, not time")
    assert int8.int8_speedup(32, 16, 1, reps=1) > 0  # the real kernels, tiny
