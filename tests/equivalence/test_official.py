"""Our model equals the official ``MemTransformerLM`` semantics for every attn_type (0-3).

The reference is ``tests/equivalence/official_oracle.py``: an independent, slow, time-first re-implementation
of the official forward (explicit distance gather, -inf masks + softmax, full adaptive log-distribution), fed
OFFICIAL-format kwargs and state dicts produced by ``transformer_xl.interop.official.to_official`` (which is therefore
tested
too). Every case runs several segments with memory through both models, with all parameters
re-initialized at a large scale so that no term hides behind near-zero weights, and compares per segment
the per-token NLL and the new memories, then the gradients of the summed loss for every parameter.

The max differences of every case are printed (``pytest -s``) as a table at the end of the module and,
when ``TXL_EQUIV_REPORT=path.json`` is set, written to that file.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import torch

from tests.equivalence.official_oracle import BUFFERS, OfficialOracle
from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.interop.official import from_official, to_official
from transformer_xl.model.positional import rel_shift

NLL_TOL = 1e-5  # absolute, per token
MEM_TOL = 1e-5  # absolute, per element
# float32 runs: plus this much relative to the value (a few float32 ulps; pre-LN NLLs reach ~35 here,
# where one ulp is 3.8e-6)
F32_RTOL = 1e-6
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
INIT_STD = 0.3

#: case id -> {"nll": max |NLL diff|, "mem": max |memory diff|, "grad": max |grad diff|}
RESULTS: dict[str, dict[str, float]] = {}

BASE: dict[str, Any] = dict(n_token=40, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=24, dropout=0.0,
                            dropatt=0.0, tgt_len=5, ext_len=0, mem_len=6, bsz=3, n_seg=3)

SOFTMAX: dict[str, dict[str, Any]] = {
    "softmax": dict(cutoffs=[], div_val=1),
    "adapt-div1": dict(cutoffs=[10, 25], div_val=1, tie_projs=[False, True, True]),  # no projections
    "adapt-div1-demb12": dict(cutoffs=[10, 25], div_val=1, d_embed=12, tie_projs=[True, False, True]),
    "adapt-div2": dict(cutoffs=[10, 25], div_val=2, tie_projs=[False, True, False]),
}

CASES: dict[str, dict[str, Any]] = {}
for _t in range(4):
    for _sm, _kw in SOFTMAX.items():
        for _pre in (False, True):
            CASES[f"t{_t}-{_sm}-{'preLN' if _pre else 'postLN'}"] = dict(attn_type=_t, pre_lnorm=_pre, **_kw)
for _t in range(4):
    CASES[f"t{_t}-same_length"] = dict(attn_type=_t, same_length=True, cutoffs=[10, 25], div_val=2)
    CASES[f"t{_t}-same_length-mem<tgt"] = dict(attn_type=_t, same_length=True, mem_len=3, pre_lnorm=True)
    CASES[f"t{_t}-ext_len2"] = dict(attn_type=_t, ext_len=2, cutoffs=[10, 25], div_val=1, d_embed=12,
                                    tie_projs=[True])
    CASES[f"t{_t}-mem<tgt"] = dict(attn_type=_t, mem_len=3, cutoffs=[10, 25], div_val=2)
    CASES[f"t{_t}-mem>>tgt"] = dict(attn_type=_t, mem_len=9, tgt_len=3, n_seg=5, pre_lnorm=True)
    CASES[f"t{_t}-mem_len0"] = dict(attn_type=_t, mem_len=0)
    CASES[f"t{_t}-tie_weight-False"] = dict(attn_type=_t, tie_weight=False, cutoffs=[10, 25], div_val=2,
                                            tie_projs=[True, False, True])
for _t in (0, 1, 2):  # attn_type 3 has no clamp_len
    CASES[f"t{_t}-clamp_len3"] = dict(attn_type=_t, clamp_len=3, cutoffs=[10, 25], div_val=2)
    CASES[f"t{_t}-clamp_len3-same_length-preLN"] = dict(attn_type=_t, clamp_len=3, same_length=True,
                                                        pre_lnorm=True)
CASES.update({
    "t0-untie_r-postLN": dict(attn_type=0, untie_r=True, cutoffs=[10, 25], div_val=2),
    "t0-untie_r-preLN": dict(attn_type=0, untie_r=True, pre_lnorm=True, cutoffs=[10, 25], div_val=1),
    "t0-ext_len3>mem_len2": dict(attn_type=0, ext_len=3, mem_len=2, n_seg=4),
    "t1-ext_len3>mem_len2": dict(attn_type=1, ext_len=3, mem_len=2, n_seg=4),
    "t0-qlen1": dict(attn_type=0, tgt_len=1, mem_len=3, n_seg=5, cutoffs=[10], div_val=2),
    "t1-qlen1": dict(attn_type=1, tgt_len=1, mem_len=3, n_seg=5),
    "t0-bsz1": dict(attn_type=0, bsz=1, cutoffs=[10, 25], div_val=2),
    "t0-softmax-div2": dict(attn_type=0, cutoffs=[], div_val=2, tie_projs=[True]),
    "t0-softmax-demb12": dict(attn_type=0, cutoffs=[], div_val=1, d_embed=12, tie_projs=[True]),
    "t0-one-cluster-div2-n_layer3": dict(attn_type=0, cutoffs=[20], div_val=2, n_layer=3),
    "t3-n_layer3-preLN": dict(attn_type=3, n_layer=3, pre_lnorm=True),
})
# float32 runs of a few cases (the default above is float64, where only the txl softmax's float32
# log_softmax limits the agreement).
FLOAT32 = ["t0-adapt-div2-postLN", "t1-adapt-div2-preLN", "t2-adapt-div1-demb12-postLN",
           "t3-adapt-div2-preLN", "t0-same_length", "t1-clamp_len3", "t0-ext_len2", "t0-untie_r-preLN"]


# ------------------------------------------------------------------------------------------------ helpers
def _config(case: dict[str, Any]) -> tuple[TXLConfig, int, int]:
    kw = {**BASE, **case}
    bsz, n_seg = kw.pop("bsz"), kw.pop("n_seg")
    return TXLConfig(**kw), bsz, n_seg


def _randomize(model: torch.nn.Module, seed: int, std: float = INIT_STD) -> None:
    """Every parameter (biases and LayerNorm included) ~ N(0, std); LayerNorm weights ~ N(1, std)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64) * std
            p.copy_(noise + (1.0 if name.endswith("layer_norm.weight") else 0.0))


def _segments(n_token: int, bsz: int, n_seg: int, tgt_len: int, ext_len: int,
              seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Time-first ``(data [Q, B], target [T, B])`` as the official ``LMOrderedIterator`` cuts them:
    the input carries up to ``ext_len`` previous tokens, the target only the last ``tgt_len``."""
    stream = torch.randint(0, n_token, (n_seg * tgt_len + 1, bsz), generator=torch.Generator().manual_seed(seed))
    out = []
    for k in range(n_seg):
        i = k * tgt_len
        beg = max(0, i - ext_len)
        out.append((stream[beg : i + tgt_len], stream[i + 1 : i + 1 + tgt_len]))
    return out


def _official_grads(model: TransformerXLLM) -> dict[str, torch.Tensor]:
    """Our gradients under official names: the converter applied to a copy holding grads as weights."""
    shadow = copy.deepcopy(model)  # keeps the ties
    with torch.no_grad():
        for (_, p), (_, g) in zip(model.named_parameters(), shadow.named_parameters()):
            g.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    _, state = to_official(shadow)
    return {k: v for k, v in state.items() if k not in BUFFERS}


def _build(case: dict[str, Any], dtype: torch.dtype, seed: int = 0):
    cfg, bsz, n_seg = _config(case)
    torch.manual_seed(seed)
    model = TransformerXLLM(cfg).to(dtype)
    _randomize(model, seed=seed + 1)
    model.eval()
    kwargs, state = to_official(model)
    oracle = OfficialOracle(kwargs, state)  # checks official keys, shapes and ties
    return cfg, bsz, n_seg, model, oracle


def _fail(what: str, case_id: str, case: dict[str, Any], diff: float, seg: int | str) -> str:
    return (f"MISMATCH vs official oracle: {what}, segment {seg}: max |diff| = {diff:.3e}\n"
            f"  case {case_id}: {case}")


def _compare(case_id: str, case: dict[str, Any], dtype: torch.dtype) -> dict[str, float]:
    cfg, bsz, n_seg, model, oracle = _build(case, dtype)
    rtol = F32_RTOL if dtype == torch.float32 else 0.0
    segments = _segments(cfg.n_token, bsz, n_seg, cfg.tgt_len, cfg.ext_len, seed=7)
    our_mems: list[torch.Tensor] = []
    off_mems: list[torch.Tensor] = []
    our_total = off_total = 0.0
    worst = {"nll": 0.0, "mem": 0.0}
    for s, (data, target) in enumerate(segments):
        before = [m.clone() for m in our_mems]
        out = model(data.t(), target.t(), our_mems)
        for a, b in zip(before, our_mems):  # memories are functional state: inputs untouched
            assert torch.equal(a, b), f"case {case_id}: our forward modified its input memories (segment {s})"
        off_nll, off_mems = oracle(data, target, off_mems)
        ref = off_nll.t().double()
        excess = (out.nll.double() - ref).abs() - NLL_TOL - rtol * ref.abs()
        d_nll = (out.nll.double() - ref).abs().max().item()
        worst["nll"] = max(worst["nll"], d_nll)
        assert excess.max().item() <= 0, _fail("per-token NLL", case_id, case, d_nll, s)
        assert len(out.mems) == len(off_mems), (f"case {case_id}: {len(out.mems)} memories vs official "
                                                f"{len(off_mems)}")
        for layer, (ours_m, off_m) in enumerate(zip(out.mems, off_mems)):
            assert ours_m.shape == off_m.transpose(0, 1).shape, (
                f"case {case_id}: memory {layer} shape {tuple(ours_m.shape)} vs official "
                f"{tuple(off_m.transpose(0, 1).shape)} (segment {s})")
            if not ours_m.numel():
                continue
            ref_m = off_m.transpose(0, 1).double()
            d_mem = (ours_m.double() - ref_m).abs().max().item()
            worst["mem"] = max(worst["mem"], d_mem)
            excess = (ours_m.double() - ref_m).abs() - MEM_TOL - rtol * ref_m.abs()
            assert excess.max().item() <= 0, _fail(f"memory of layer {layer}", case_id, case, d_mem, s)
        our_mems = out.mems
        our_total = our_total + out.loss
        off_total = off_total + off_nll.mean()

    our_total.backward()
    off_total.backward()
    ours = _official_grads(model)
    worst["grad"] = 0.0
    for name, g in sorted(ours.items()):
        ref = oracle.grad(name)
        ref = torch.zeros_like(g) if ref is None else ref.to(g.dtype)
        diff = (g - ref).abs().max().item()
        worst["grad"] = max(worst["grad"], diff)
        try:
            torch.testing.assert_close(g, ref, atol=GRAD_ATOL, rtol=GRAD_RTOL)
        except AssertionError as exc:
            raise AssertionError(_fail(f"gradient of {name}", case_id, case, diff, "sum of all") + f"\n{exc}") \
                from None
    return worst


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if not RESULTS:
        return
    width = max(len(k) for k in RESULTS)
    lines = [f"{'config':<{width}}  {'max|dNLL|':>10}  {'max|dmem|':>10}  {'max|dgrad|':>10}"]
    for key in sorted(RESULTS):
        r = RESULTS[key]
        lines.append(f"{key:<{width}}  {r['nll']:>10.2e}  {r['mem']:>10.2e}  {r['grad']:>10.2e}")
    print("\n[official-oracle] max differences, txl vs official semantics\n" + "\n".join(lines))
    path = os.environ.get("TXL_EQUIV_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(RESULTS, f, indent=1, sort_keys=True)


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("case_id", sorted(CASES))
def test_matches_official_float64(case_id: str) -> None:
    RESULTS[f"{case_id} [f64]"] = worst = _compare(case_id, CASES[case_id], torch.float64)
    print(f"[official-oracle] {case_id} [f64]: nll {worst['nll']:.2e} mem {worst['mem']:.2e} "
          f"grad {worst['grad']:.2e}")


@pytest.mark.parametrize("case_id", FLOAT32)
def test_matches_official_float32(case_id: str) -> None:
    RESULTS[f"{case_id} [f32]"] = worst = _compare(case_id, CASES[case_id], torch.float32)
    print(f"[official-oracle] {case_id} [f32]: nll {worst['nll']:.2e} mem {worst['mem']:.2e} "
          f"grad {worst['grad']:.2e}")


@pytest.mark.parametrize("attn_type", [0, 1, 3])
def test_longer_evaluation_memory_than_built(attn_type: int) -> None:
    """A memory longer than the model was built with (``lengths=``, as the paper's evaluation does):
    attn_type 1 then reads distances past its table (first row reused) and attn_type 3 pads the memory's
    embeddings with the table's first row."""
    case = dict(attn_type=attn_type, mem_len=2, cutoffs=[10, 25], div_val=2)
    cfg, bsz, _, model, oracle = _build(case, torch.float64)
    lengths = cfg.lengths(mem_len=8)
    oracle.reset_length(tgt_len=cfg.tgt_len, ext_len=0, mem_len=8)
    our_mems: list[torch.Tensor] = []
    off_mems: list[torch.Tensor] = []
    worst = worst_mem = 0.0
    for s, (data, target) in enumerate(_segments(cfg.n_token, bsz, 4, cfg.tgt_len, 0, seed=3)):
        out = model(data.t(), target.t(), our_mems, lengths=lengths)
        off_nll, off_mems = oracle(data, target, off_mems)
        our_mems = out.mems
        d = (out.nll.double() - off_nll.t()).abs().max().item()
        worst = max(worst, d)
        assert d <= NLL_TOL, _fail("per-token NLL", f"longer-eval-mem t{attn_type}", case, d, s)
        for a, b in zip(out.mems, off_mems):
            worst_mem = max(worst_mem, (a - b.transpose(0, 1)).abs().max().item())
            torch.testing.assert_close(a, b.transpose(0, 1), atol=MEM_TOL, rtol=0)
    assert our_mems[0].size(1) == 8
    # forward only: no gradient figure
    RESULTS[f"t{attn_type}-eval-mem_len2->8 [f64]"] = {"nll": worst, "mem": worst_mem, "grad": float("nan")}


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_from_official_matches_oracle(attn_type: int) -> None:
    """An official state dict drawn at random (never produced by txl) loads with ``from_official`` into a
    model that equals the oracle run on that very state dict."""
    kwargs = dict(n_token=40, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=24, dropout=0.0, dropatt=0.0,
                  tie_weight=True, d_embed=16, div_val=2, tie_projs=[False, True, True], pre_lnorm=attn_type % 2 == 1,
                  tgt_len=5, ext_len=0, mem_len=6, cutoffs=[10, 25], adapt_inp=True, same_length=False,
                  attn_type=attn_type, clamp_len=-1, sample_softmax=-1)
    # float32, as official checkpoints are; both models then run in float64
    state = OfficialOracle(kwargs, None).random_state_dict(seed=11 + attn_type, dtype=torch.float32)
    if attn_type in (0, 2):
        state["pos_emb.inv_freq"] = 1 / (10000 ** (torch.arange(0.0, 16, 2.0) / 16))
    oracle = OfficialOracle(kwargs, state, dtype=torch.float64)
    model = from_official(kwargs, state).double().eval()
    our_mems: list[torch.Tensor] = []
    off_mems: list[torch.Tensor] = []
    for s, (data, target) in enumerate(_segments(40, 3, 3, 5, 0, seed=5)):
        out = model(data.t(), target.t(), our_mems)
        off_nll, off_mems = oracle(data, target, off_mems)
        our_mems = out.mems
        d = (out.nll.double() - off_nll.t()).abs().max().item()
        assert d <= NLL_TOL, _fail("per-token NLL (from_official)", f"from_official t{attn_type}", kwargs, d, s)
        for a, b in zip(out.mems, off_mems):
            torch.testing.assert_close(a, b.transpose(0, 1), atol=MEM_TOL, rtol=0)
    # and back: to_official returns the same official tensors
    _, back = to_official(model)
    for name, t in state.items():
        if name not in BUFFERS:
            torch.testing.assert_close(back[name].float(), t, atol=0, rtol=0, msg=name)


def test_memory_update_call_site_swap_is_harmless_without_ext_len() -> None:
    """The official ``_forward`` calls ``_update_mems(hids, mems, mlen, qlen)`` against the signature
    ``(hids, mems, qlen, mlen)``. We (and the oracle) use the documented formula; with ``ext_len == 0``
    both are the same, segment after segment. With ``ext_len > 0`` they differ on the first segment
    (``mlen = 0``): the swapped form keeps all ``qlen`` positions, the documented one ``qlen - ext_len``."""
    for ext_len in (0, 2):
        case = dict(attn_type=0, ext_len=ext_len, cutoffs=[10, 25], div_val=2)
        cfg, bsz, n_seg, model, oracle = _build(case, torch.float64)
        intended: list[torch.Tensor] = []
        swapped: list[torch.Tensor] = []
        for s, (data, target) in enumerate(_segments(cfg.n_token, bsz, n_seg, cfg.tgt_len, ext_len, seed=1)):
            nll_a, intended = oracle(data, target, intended)
            nll_b, swapped = oracle(data, target, swapped, official_call_site_swap=True)
            if ext_len == 0:
                assert all(torch.equal(a, b) for a, b in zip(intended, swapped))
                assert torch.equal(nll_a, nll_b)
            elif s == 0:
                assert intended[0].size(0) == cfg.tgt_len - ext_len
                assert swapped[0].size(0) == cfg.tgt_len
                ours = model(data.t(), target.t()).mems  # ours: the documented intent
                assert ours[0].size(1) == cfg.tgt_len - ext_len
            else:  # once mlen >= ext_len, the two formulas agree again
                assert intended[0].size(0) == swapped[0].size(0) == cfg.mem_len


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_input_memories_bit_identical_after_forward(attn_type: int) -> None:
    """The official attn_type 2/3 add position embeddings to the memories in place; ours must not."""
    cfg, bsz, _, model, _ = _build(dict(attn_type=attn_type, pre_lnorm=True), torch.float32)
    data, target = _segments(cfg.n_token, bsz, 1, cfg.tgt_len, 0, seed=2)[0]
    mems = [torch.randn(bsz, 4, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    snapshot = [m.clone() for m in mems]
    model(data.t(), target.t(), mems)
    with torch.no_grad():
        model(data.t(), target.t(), mems)
    for a, b in zip(mems, snapshot):
        assert torch.equal(a, b)


@pytest.mark.parametrize("qlen,klen", [(1, 1), (1, 6), (4, 4), (3, 7), (5, 6), (6, 13)])
def test_rel_shift_equals_explicit_gather(qlen: int, klen: int) -> None:
    """``rel_shift(x)[..., i, j] == x[..., i, klen-1-d]`` for distance ``d = mlen+i-j >= 0`` (x's row r
    holds distance ``klen-1-r``), checked against an explicit gather."""
    x = torch.randn(2, 3, qlen, klen, generator=torch.Generator().manual_seed(qlen * 31 + klen))
    mlen = klen - qlen
    out = rel_shift(x)
    i = torch.arange(qlen)[:, None]
    j = torch.arange(klen)[None, :]
    dist = mlen + i - j
    valid = dist >= 0
    col = (klen - 1 - dist).clamp(0, klen - 1).expand(qlen, klen)
    expected = torch.gather(x, -1, col.expand_as(x))
    assert torch.equal(out[..., valid], expected[..., valid])
    # explicit loop for one batch element, as plainly as possible
    for a in range(qlen):
        for b in range(klen):
            if mlen + a - b >= 0:
                assert out[1, 2, a, b] == x[1, 2, a, klen - 1 - (mlen + a - b)]


@pytest.mark.parametrize("case_id", ["t0-adapt-div1-demb12-preLN", "t1-tie_weight-False", "t2-adapt-div2-postLN",
                                     "t3-same_length", "t0-untie_r-postLN", "t0-ext_len2"])
def test_official_export_files_load_into_the_oracle(tmp_path, case_id: str) -> None:
    """``txl convert --to official`` writes files an official user loads as they are: the state dict read with
    ``safetensors.torch.load_file`` (every official name, tied ones included) and the kwargs read as JSON."""
    from safetensors.torch import load_file

    from transformer_xl.cli import main
    from transformer_xl.cli.convert import OFFICIAL_KWARGS, OFFICIAL_STATE

    cfg, bsz, n_seg, model, _ = _build(CASES[case_id], torch.float32)
    model.save_pretrained(tmp_path / "model")
    model.double()
    assert main(["convert", str(tmp_path / "model"), "--to", "official", "--out", str(tmp_path / "off")]) == 0
    kwargs = json.loads((tmp_path / "off" / OFFICIAL_KWARGS).read_text())
    oracle = OfficialOracle(kwargs, load_file(str(tmp_path / "off" / OFFICIAL_STATE)), dtype=torch.float64)
    our_mems: list[torch.Tensor] = []
    off_mems: list[torch.Tensor] = []
    worst = 0.0
    for data, target in _segments(cfg.n_token, bsz, n_seg, cfg.tgt_len, cfg.ext_len, seed=9):
        out = model(data.t(), target.t(), our_mems)
        off_nll, off_mems = oracle(data, target, off_mems)
        our_mems = out.mems
        worst = max(worst, (out.nll - off_nll.t()).abs().max().item())
    print(f"[official-export] {case_id}: max |nll diff| over {n_seg} segments = {worst:.2e}")
    assert worst <= NLL_TOL, f"{case_id}: {worst}"
