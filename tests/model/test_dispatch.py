"""The one dispatch point: :func:`choose` picks each path in each row of its table, :func:`attend` runs the path it
picks, and every fast path equals the paper's formulas as written (the plain path, ``TransformerXLLM.reference``)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model
from transformer_xl.model import blocked, dispatch, fastpath, positional
from transformer_xl.model.dispatch import BLOCKED, EXPLICIT, FLEX, FUSED, ONE_QUERY, PLAIN, SHIFTED, attend, choose
from transformer_xl.model.memory import additive_mask, causal_mask
from transformer_xl.model.positional import PositionScores

CPU, GPU = torch.device("cpu"), torch.device("cuda")
FACTS = dict(grad=False, qlen=4, device=CPU, compiling=False, dropatt=0.0, factored=True, threads=1)


@pytest.mark.parametrize("change,path", [
    (dict(plain=True), PLAIN),
    (dict(plain=True, grad=True), PLAIN),
    (dict(grad=True), SHIFTED),
    (dict(grad=True, threads=2, dropatt=0.1), SHIFTED),
    (dict(plain=True, grad=True, device=GPU, flex=True), PLAIN),
    (dict(grad=True, factored=False), EXPLICIT),
    (dict(grad=True, device=GPU, flex=True), FLEX),
    (dict(grad=True, device=GPU, flex=True, compiling=True, factored=False), FLEX),
    (dict(grad=True, device=GPU, flex=True, dropatt=0.1), FUSED),
    (dict(grad=True, device=GPU), FUSED),
    (dict(grad=True, device=GPU, compiling=True), FUSED),
    (dict(grad=True, device=GPU, factored=False, dropatt=0.1), FUSED),
    (dict(grad=True, compiling=True), EXPLICIT),
    (dict(grad=True, compiling=True, qlen=1), EXPLICIT),
    (dict(grad=True, device=torch.device("mps"), flex=True), EXPLICIT),
    (dict(dropatt=0.1), FUSED),
    (dict(qlen=1), ONE_QUERY),
    (dict(qlen=1, device=GPU, compiling=True), ONE_QUERY),
    ({}, BLOCKED),
    (dict(threads=2), BLOCKED),
    (dict(device=GPU), FUSED),
    (dict(device=GPU, flex=True), FUSED),
    (dict(compiling=True), FUSED),
    (dict(factored=False), FUSED),
])
def test_choose_follows_its_table(change: dict, path: dispatch.Path) -> None:
    assert choose(**{**FACTS, **change}).path is path


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("compiling", [False, True])
@pytest.mark.parametrize("factored", [False, True])
@pytest.mark.parametrize("dropatt", [0.0, 0.1])
@pytest.mark.parametrize("qlen", [1, 4])
def test_the_flex_switch_changes_no_cpu_row(grad: bool, compiling: bool, factored: bool, dropatt: float,
                                            qlen: int) -> None:
    facts = dict(FACTS, grad=grad, compiling=compiling, factored=factored, dropatt=dropatt, qlen=qlen)
    assert choose(**facts, flex=True) == choose(**facts)


def test_the_block_size_follows_the_threads() -> None:
    assert choose(**FACTS).block_bytes == blocked.one_thread_block_bytes()
    assert choose(**{**FACTS, "threads": 4}).block_bytes == blocked.BLOCK_BYTES_THREADS


def _inputs(Q: int, shaw: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, M, E = 2, 3, 5, 4
    K = Q + M
    q, x = (torch.randn(B, H, Q, E, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, H, K, E, generator=gen) for _ in range(2))
    p = PositionScores(x, torch.randn(K, H, E, generator=gen), torch.randn(K, H, generator=gen) if shaw else None)
    mask = additive_mask(causal_mask(qlen=Q, mlen=M, mem_len=M, same_length=False, device=CPU), torch.float32)
    return q, k, v, p, mask


@pytest.mark.parametrize("shaw", [False, True])
@pytest.mark.parametrize("Q,grad,path", [(4, True, SHIFTED), (4, False, BLOCKED), (1, False, ONE_QUERY),
                                         (1, True, SHIFTED)])
def test_attend_runs_the_chosen_path_and_it_equals_the_plain_one(shaw: bool, Q: int, grad: bool, path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, p, mask = _inputs(Q, shaw)
    plain = attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, plain=True)
    ran: list[str] = []

    def spy(module, name: str) -> None:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **kw: ran.append(name) or real(*a, **kw))

    for name in ("attend_explicit", "attend_fused", "attend_one_query", "attend_shifted"):
        spy(dispatch, name)
    spy(blocked, "attend_blocked")
    with torch.set_grad_enabled(grad):
        got = attend(q.requires_grad_(grad), k, v, p, mask, scale=0.5, dropatt=0.0)
    assert ran == [{SHIFTED: "attend_shifted", BLOCKED: "attend_blocked", ONE_QUERY: "attend_one_query"}[path]]
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)


def test_fused_path_equals_the_plain_one_for_a_position_term_given_whole() -> None:
    q, k, v, p, mask = _inputs(4, shaw=True)
    dense = p.dense()
    with torch.no_grad():
        got = attend(q, k, v, dense, mask, scale=0.5, dropatt=0.0)
        want = attend(q, k, v, dense, mask, scale=0.5, dropatt=0.0, plain=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_the_model_on_the_paper_formulas_equals_its_fast_paths(attn_type: int, monkeypatch) -> None:
    """Training (loss and gradients), evaluation with a memory and a one-token step: the reference model runs
    ``rel_shift`` (relative encodings) and no fast attention, and gives the fast model's values."""
    fast = tiny_model(attn_type=attn_type, tgt_len=4, mem_len=6 if attn_type != 3 else 0)
    ref = tiny_model(attn_type=attn_type, tgt_len=4, mem_len=6 if attn_type != 3 else 0)
    ref.load_state_dict(fast.state_dict())
    ref.reference()
    x = torch.randint(0, fast.config.n_token, (2, 4), generator=torch.Generator().manual_seed(1))
    shifts: list[int] = []
    monkeypatch.setattr(positional, "rel_shift", lambda t, _f=positional.rel_shift: shifts.append(1) or _f(t))
    outs = []
    for model in (fast, ref):
        if model is ref:  # the reference model must not reach a fast attention
            for module, name in ((dispatch, "attend_explicit"), (dispatch, "attend_fused"),
                                 (dispatch, "attend_one_query"), (blocked, "attend_blocked"),
                                 (dispatch, "attend_flex")):
                monkeypatch.setattr(module, name, None)
        mems = model(x).mems
        res = model(x, x, mems)
        res.loss.backward()
        model.eval()
        with torch.no_grad():
            step = model(x[:, :1], x[:, :1], res.mems).nll
        outs.append((res.nll.detach(), [p.grad for p in model.parameters()], step))
    assert bool(shifts) == (attn_type in (0, 1))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1][2], outs[0][2], rtol=1e-5, atol=1e-5)
    for g_ref, g_fast in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(g_ref, g_fast, rtol=1e-4, atol=1e-5)


def test_compiling_makes_the_mask_in_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager: the cached mask itself; compiling: a mask made anew (a cache lookup would guard on the cache's
    contents and compile every segment shape twice), equal to it."""
    kw = dict(qlen=3, mlen=4, mem_len=4, same_length=True, device=CPU, dtype=torch.float32)
    cached = fastpath.mask_bias(**kw)
    assert dispatch.mask_bias(**kw) is cached
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    made = dispatch.mask_bias(**kw)
    assert made is not cached and torch.equal(made, cached)


@pytest.mark.parametrize("Q,grad,path", [(4, True, EXPLICIT), (4, False, FUSED), (1, False, ONE_QUERY)])
def test_a_mask_per_row_runs_every_path_like_the_plain_one(Q: int, grad: bool, path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``[B, 1, Q, K]`` mask (episode boundaries of :mod:`transformer_xl.model.sequence`): each row keeps its own
    keys, the blocked path (one ``[Q, K]`` mask for all rows) is not taken, and every path equals the formula."""
    q, k, v, p, mask = _inputs(Q, shaw=False)
    rows = mask.expand(2, 1, *mask.shape).clone()
    rows[1, 0, :, :3] = float("-inf")  # row 1 loses its first three keys, row 0 keeps them
    plain = attend(q, k, v, p, rows, scale=0.5, dropatt=0.0, plain=True)
    ran: list[str] = []
    for name in ("attend_explicit", "attend_fused", "attend_one_query"):
        real = getattr(dispatch, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _r=real, _n=name, **kw: ran.append(_n) or _r(*a, **kw))
    with torch.set_grad_enabled(grad):
        got = attend(q.requires_grad_(grad), k, v, p, rows, scale=0.5, dropatt=0.0)
    assert ran == [{EXPLICIT: "attend_explicit", FUSED: "attend_fused", ONE_QUERY: "attend_one_query"}[path]]
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)
    shared = attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, plain=True)
    torch.testing.assert_close(got[0], shared[0], rtol=1e-5, atol=1e-6)  # row 0: the mask shared by all rows
    assert not torch.allclose(got[1], shared[1])  # row 1: its own mask


@pytest.mark.parametrize("path,Q,grad", [(PLAIN, 4, True), (SHIFTED, 4, True), (EXPLICIT, 4, True), (FUSED, 4, True),
                                         (FUSED, 4, False), (BLOCKED, 4, False), (ONE_QUERY, 1, False),
                                         (FLEX, 4, False), (FLEX, 1, False)])
def test_a_named_path_runs_and_equals_the_plain_one(path, Q: int, grad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``attend(..., path=...)`` runs that implementation whatever :func:`choose` would pick (the GPU check compares
    a named path with :data:`PLAIN`); by value as well (``"flex"``)."""
    q, k, v, p, mask = _inputs(Q, shaw=True)
    plain = attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, plain=True)
    ran: list[str] = []
    names = {SHIFTED: "attend_shifted", EXPLICIT: "attend_explicit", FUSED: "attend_fused",
             ONE_QUERY: "attend_one_query", FLEX: "attend_flex"}
    for name in names.values():
        real = getattr(dispatch, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _r=real, _n=name, **kw: ran.append(_n) or _r(*a, **kw))
    real_blocked = blocked.attend_blocked
    monkeypatch.setattr(blocked, "attend_blocked", lambda *a, **kw: ran.append("attend_blocked") or
                        real_blocked(*a, **kw))
    with torch.set_grad_enabled(grad):
        got = attend(q.requires_grad_(grad), k, v, p, mask, scale=0.5, dropatt=0.0, path=path.value)
    assert ran == ([] if path is PLAIN else [{**names, BLOCKED: "attend_blocked"}[path]])
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path,Q,grad,dropatt,rows,match", [
    (FLEX, 4, False, 0.1, False, "no dropout"),
    (ONE_QUERY, 4, False, 0.0, False, "one query"),
    (BLOCKED, 4, True, 0.0, False, "no gradient"),
    (BLOCKED, 4, False, 0.0, True, r"one \[Q, K\] mask"),
    (SHIFTED, 4, True, 0.0, True, r"one \[Q, K\] mask"),
])
def test_a_named_path_that_cannot_run_is_a_value_error(path, Q: int, grad: bool, dropatt: float, rows: bool,
                                                       match: str) -> None:
    q, k, v, p, mask = _inputs(Q, shaw=False)
    if rows:
        mask = mask.expand(2, 1, *mask.shape)
    with pytest.raises(ValueError, match=match), torch.set_grad_enabled(grad):
        attend(q.requires_grad_(grad), k, v, p, mask, scale=0.5, dropatt=dropatt, path=path)
    with pytest.raises(ValueError, match="is not a valid Path"):
        attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, path="fast")
