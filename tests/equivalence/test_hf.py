"""attn_type 0 equals Hugging Face's TransfoXL (test-only oracle), weights converted with transformer_xl.interop.hf.

HF TransfoXL lives under ``transformers.models.deprecated.transfo_xl`` in transformers 4.35-4.57. Releases
4.38-4.57 call ``Tensor.type_as(dtype=...)`` in forward, which torch rejects; ``hf_compat``
makes that call work for the duration of a test. HF differs from the official code in ways the test
handles explicitly: its memories start as ``mem_len`` zeros unless given (we pass empty ones), it keeps
``n_layer`` memories (we keep ``n_layer + 1``), its loss shifts labels internally and reorders tokens by
cluster unless ``keep_order=True``, and its cluster rows are in the opposite order (see transformer_xl.interop.hf).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY
from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.interop.hf import config_from_hf, from_hf, from_hf_state_dict, to_hf_state_dict
from transformer_xl.interop.hf import hf_compat as hf_type_as_patch

pytestmark = pytest.mark.hf4
transfo = pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
from transformers.models.deprecated.transfo_xl import TransfoXLConfig  # noqa: E402

B, Q, N_SEG = 3, 6, 3


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


CASES = {
    "plain": dict(cutoffs=[], div_val=1),
    "adaptive-div1": dict(cutoffs=[20, 40], div_val=1),
    "adaptive-div2": dict(cutoffs=[20, 40], div_val=2, proj_share_all_but_first=True),
    "adaptive-div2-untied-projs": dict(cutoffs=[20, 40], div_val=2, proj_share_all_but_first=False),
    "d_embed-ne-d_model": dict(cutoffs=[20, 40], div_val=1, d_embed=12),
    "pre-lnorm": dict(cutoffs=[20], div_val=2, pre_lnorm=True),
    "same-length-clamp": dict(cutoffs=[], div_val=1, same_length=True, clamp_len=4),
    "tied-r": dict(cutoffs=[30], div_val=1, untie_r=False),
    "long-mem": dict(cutoffs=[], div_val=1, mem_len=13),
}


def _hf_config(**overrides) -> TransfoXLConfig:
    base = dict(vocab_size=60, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=5,
                clamp_len=-1, same_length=False, dropout=0.0, dropatt=0.0, untie_r=True, pre_lnorm=False,
                proj_share_all_but_first=True)
    base.update(overrides)
    return TransfoXLConfig(**base)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_hf_transfo_xl(case: str) -> None:
    torch.manual_seed(0)
    hf_cfg = _hf_config(**CASES[case])
    hf = transfo.TransfoXLLMHeadModel(hf_cfg).eval()
    _randomize(hf, seed=1)
    cfg = config_from_hf(hf_cfg.to_dict())
    ours = from_hf_state_dict(cfg, hf.state_dict()).eval()

    data = torch.randint(0, 60, (B, Q * N_SEG + 1), generator=torch.Generator().manual_seed(2))
    hf_mems = [torch.empty(0, B, cfg.d_model) for _ in range(cfg.n_layer)]
    our_mems = None
    hf_total = our_total = 0.0
    worst = 0.0
    with hf_type_as_patch():
        for s in range(N_SEG):
            x, y = data[:, s * Q:(s + 1) * Q], data[:, s * Q + 1:(s + 1) * Q + 1]
            h = hf.transformer(input_ids=x, mems=hf_mems)
            hf_mems = h.mems
            # HF's criterion shifts labels by one: pad so that hidden[:, t] is scored against y[:, t].
            hidden = torch.cat([h.last_hidden_state, torch.zeros(B, 1, cfg.d_model)], dim=1)
            labels = torch.cat([x[:, :1], y], dim=1)
            hf_nll = hf.crit(hidden, labels, keep_order=True).view(B, Q)
            out = ours(x, y, our_mems)
            our_mems = out.mems
            worst = max(worst, (out.nll - hf_nll).abs().max().item())
            torch.testing.assert_close(out.nll, hf_nll, atol=1e-5, rtol=1e-5)
            for ours_m, hf_m in zip(our_mems[: cfg.n_layer], hf_mems):
                torch.testing.assert_close(ours_m, hf_m.transpose(0, 1), atol=1e-5, rtol=1e-5)
            hf_total = hf_total + hf_nll.sum()
            our_total = our_total + out.nll.sum()
    print(f"[hf-oracle] {case}: max |nll diff| = {worst:.2e}")

    # Gradients of the 3-segment loss agree parameter by parameter (mapped through the converter).
    hf_total.backward()
    our_total.backward()
    hf_grads = {k: p.grad for k, p in hf.named_parameters() if p.grad is not None}
    mapped = to_hf_state_dict_grads(ours)
    max_grad = 0.0
    compared = 0
    for name, g in mapped.items():
        if name not in hf_grads:  # tied copies appear once in named_parameters
            continue
        max_grad = max(max_grad, (g - hf_grads[name]).abs().max().item())
        torch.testing.assert_close(g, hf_grads[name], atol=1e-5, rtol=1e-4, msg=f"grad of {name}")
        compared += 1
    # Every HF parameter was compared (a broken name mapping would compare none), and every one had a gradient.
    assert compared == len(hf_grads) == len(dict(hf.named_parameters())), (compared, sorted(hf_grads))
    print(f"[hf-oracle] {case}: {compared} gradients compared, max |grad diff| = {max_grad:.2e}")


def to_hf_state_dict_grads(model: TransformerXLLM) -> dict[str, torch.Tensor]:
    """Our gradients under HF names (same mapping as the weights)."""
    grads = {}
    shadow = TransformerXLLM(model.config)
    with torch.no_grad():
        for p, q in zip(model.parameters(), shadow.parameters()):
            q.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    for name, t in to_hf_state_dict(shadow).items():
        grads[name] = t
    return grads


def test_hf_directory_round_trip(tmp_path) -> None:
    """from_hf reads a saved HF directory (safetensors, tied copies dropped) into the same model."""
    hf_cfg = _hf_config(cutoffs=[20, 40], div_val=2)
    hf = transfo.TransfoXLLMHeadModel(hf_cfg).eval()
    _randomize(hf, seed=3)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    ref = from_hf_state_dict(config_from_hf(hf_cfg.to_dict()), hf.state_dict())
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    back = to_hf_state_dict(ours)
    for k, v in hf.state_dict().items():
        torch.testing.assert_close(back[k], v, msg=k)


# ------------------------------------------------------------------ txl convert --to hf, read by transformers itself
#: txl configurations (over tests.helpers.TINY: d_model 16, 2 heads of 8, 2 layers) exported with `txl convert`.
EXPORTS = {
    "plain-shared-r": dict(),
    "plain-untied-r": dict(untie_r=True),
    "div1-tied-projs-d_embed-ne-d_model": dict(cutoffs=[20, 40], div_val=1, d_embed=12, tie_projs=[True, True, True]),
    "div1-untied-projs-d_embed-ne-d_model": dict(cutoffs=[20, 40], div_val=1, d_embed=12,
                                                 tie_projs=[False, False, False]),
    "div1-d_embed-eq-d_model": dict(cutoffs=[20, 40], div_val=1, untie_r=True),
    "div2-tied-projs": dict(cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True]),
    "div2-untied-projs-untied-weights": dict(cutoffs=[20, 40], div_val=2, tie_projs=[False, False, False],
                                             tie_weight=False),
    "div2-d_embed-32-all-projs-tied": dict(cutoffs=[20, 40], div_val=2, d_embed=32, tie_projs=[True, True, True]),
    "div4-pre-lnorm-untied-r": dict(cutoffs=[20, 40], div_val=4, pre_lnorm=True, untie_r=True),
    "same-length-clamp-shared-r": dict(cutoffs=[30], same_length=True, clamp_len=3, tie_weight=False),
    "same-length-untied-r-long-mem": dict(same_length=True, untie_r=True, mem_len=13),
}


@contextlib.contextmanager
def _transformers_log() -> Iterator[io.StringIO]:
    """What transformers logs (warnings and up) inside the block."""
    from transformers.utils import logging as hf_logging

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    root = hf_logging.get_logger("transformers")
    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    root.addHandler(handler)
    try:
        yield buf
    finally:
        root.removeHandler(handler)
        hf_logging.set_verbosity(old)


def _export(tmp_path, **overrides) -> tuple[TransformerXLLM, Path]:
    from transformer_xl.cli import main

    torch.manual_seed(0)
    model = TransformerXLLM(TXLConfig(**{**TINY, "n_token": 60, **overrides}))
    _randomize(model, seed=5)  # LayerNorm, biases and u, v too
    model.eval().save_pretrained(tmp_path / "model")
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    return model, tmp_path / "hf"


def _hf_nll(hf, data: torch.Tensor, mems: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """Per-token NLL of HF's public forward over N_SEG segments of Q (``prediction_scores`` are log-probabilities
    when no labels are given), memories carried from ``mems``."""
    out = []
    with hf_type_as_patch(), torch.no_grad():
        for s in range(N_SEG):
            x, y = data[:, s * Q:(s + 1) * Q], data[:, s * Q + 1:(s + 1) * Q + 1]
            res = hf(input_ids=x, mems=mems)
            mems = res.mems
            out.append(-res.prediction_scores.gather(-1, y[..., None])[..., 0])
    return out


def _our_nll(model: TransformerXLLM, data: torch.Tensor) -> list[torch.Tensor]:
    out, mems = [], None
    with torch.no_grad():
        for s in range(N_SEG):
            res = model(data[:, s * Q:(s + 1) * Q], data[:, s * Q + 1:(s + 1) * Q + 1], mems)
            mems = res.mems
            out.append(res.nll)
    return out


def _empty_mems(hf) -> list[torch.Tensor]:
    """The official empty start: n_layer memories of length 0 (``mems=None`` would give mem_len zero vectors)."""
    return [torch.empty(0, B, hf.config.d_model) for _ in range(hf.config.n_layer)]


@pytest.mark.parametrize("case", sorted(EXPORTS))
def test_export_loads_in_transformers_into_the_same_function(tmp_path, case: str) -> None:
    model, export = _export(tmp_path, **EXPORTS[case])
    with _transformers_log() as log:
        hf = transfo.TransfoXLLMHeadModel.from_pretrained(export)
    assert "newly initialized" not in log.getvalue() and "were not used" not in log.getvalue(), log.getvalue()
    assert not hf.training and hf.config.untie_r is model.config.untie_r
    data = torch.randint(0, 60, (B, Q * N_SEG + 1), generator=torch.Generator().manual_seed(2))
    ours = _our_nll(model, data)
    theirs = _hf_nll(hf, data, _empty_mems(hf))
    worst = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    print(f"[hf-export] {case}: max |nll diff| over {N_SEG} segments = {worst:.2e}")
    assert worst < 1e-5, f"{case}: {worst}"
    for i, layer in enumerate(hf.transformer.layers):  # every layer reads the shared (or its own) u, v
        u, v = (model.pos_enc.r_w_bias, model.pos_enc.r_r_bias)
        torch.testing.assert_close(layer.dec_attn.r_w_bias, u[i] if model.config.untie_r else u, atol=0, rtol=0)
        torch.testing.assert_close(layer.dec_attn.r_r_bias, v[i] if model.config.untie_r else v, atol=0, rtol=0)


def test_hf_mems_none_starts_from_zero_vectors_not_an_empty_memory(tmp_path) -> None:
    """HF's ``mems=None`` means ``init_mems``: mem_len zero hidden states that the first segment attends to."""
    model, export = _export(tmp_path, cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True])
    hf = transfo.TransfoXLLMHeadModel.from_pretrained(export)
    data = torch.randint(0, 60, (B, Q * N_SEG + 1), generator=torch.Generator().manual_seed(3))
    zeros = _hf_nll(hf, data, None)
    assert (zeros[0] - _our_nll(model, data)[0]).abs().max() > 1e-3
    torch.testing.assert_close(_hf_nll(hf, data, _empty_mems(hf))[0], _our_nll(model, data)[0])


@pytest.mark.parametrize("overrides, reason", [
    (dict(attn_type=2, mem_len=0), "attn_type 0 only"),
    (dict(sample_softmax=8), r"no sampled softmax \(sample_softmax=8"),
    (dict(ext_len=2), r"no ext_len \(ext_len=2\)"),
])
def test_export_refuses_what_transformers_cannot_compute(tmp_path, capsys, overrides, reason) -> None:
    from transformer_xl.cli import main

    TransformerXLLM(TXLConfig(**{**TINY, **overrides})).save_pretrained(tmp_path / "model")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl convert: error:") and err.count("\n") == 1 and re.search(reason, err), err
    assert not (tmp_path / "hf").exists()
