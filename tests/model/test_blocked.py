"""The blocked evaluation attention equals the plain formula it replaces.

* ``padded_mask``: adding it before the shift is adding the mask after it;
* ``attend_blocked`` == ``fastpath.attend`` with ``P`` whole, for every way of cutting the work into blocks (whole
  batch rows, heads of one row), with and without Shaw's per-distance bias, causal and same-length masks;
* ``attend`` takes the blocked path exactly when it should (CPU, no gradient, no dropout, more than one query);
* the whole model, streaming a text through ``Recurrence`` (inference cache) on the blocked path, gives the per-token
  NLL of the plain path (with a gradient: ``P`` whole, explicit softmax) within 1e-5, for attn_type 0-3,
  ``same_length``, ``clamp_len`` and an evaluation memory longer than training's.
"""

from __future__ import annotations

import pytest
import torch

from transformer_xl.model import Recurrence
from transformer_xl.model import blocked as blocked_mod
from transformer_xl.model.blocked import ShiftedScores, attend_blocked, padded_mask
from transformer_xl.model.dispatch import attend
from transformer_xl.model.dispatch import attend as attend_dense
from transformer_xl.model.fastpath import shift_padded
from transformer_xl.model.memory import additive_mask, causal_mask


def _mask(qlen: int, mlen: int, same_length: bool) -> torch.Tensor:
    return additive_mask(causal_mask(qlen=qlen, mlen=mlen, mem_len=mlen, same_length=same_length,
                                     device=torch.device("cpu")), torch.float32)


def _inputs(B: int, H: int, Q: int, M: int, E: int, shaw: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    K = Q + M
    q = torch.randn(B, H, Q, E, generator=gen)
    k, v = (torch.randn(B, H, K + 5, E, generator=gen)[:, :, 3:K + 3] for _ in range(2))  # views, as the cache's
    y = torch.cat([torch.zeros(H, E, 1), torch.randn(H, E, K, generator=gen)], dim=2)  # [H, E, K+1]
    d = torch.cat([torch.zeros(H, 1), torch.randn(H, K, generator=gen)], dim=1) if shaw else None
    p = ShiftedScores(torch.randn(H, B * Q, E, generator=gen), y, B, d)
    return q, k, v, p


@pytest.mark.parametrize("same_length", [False, True])
def test_padded_mask_before_the_shift_is_the_mask_after_it(same_length: bool) -> None:
    Q, M = 4, 6
    mask = _mask(Q, M, same_length)
    t = torch.randn(3, 2, Q, Q + M + 1)  # [.., rows, Q, K+1]
    padded = padded_mask(mask, 2).view(2, Q, Q + M + 1)
    torch.testing.assert_close(shift_padded(t + padded), shift_padded(t) + mask, rtol=0, atol=0)


@pytest.mark.parametrize("shaw", [False, True])
@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("block_bytes", [1, 2 * 5 * 14 * 4, 3 * 5 * 14 * 4, 10**9])  # a head, 2 heads, 1 row, all
def test_blocked_equals_whole(shaw: bool, same_length: bool, block_bytes: int) -> None:
    B, H, Q, M, E = 3, 4, 5, 8, 6  # a [Q, K+1] block of one head is 5 * 14 * 4 bytes
    q, k, v, p = _inputs(B, H, Q, M, E, shaw)
    mask = _mask(Q, M, same_length)
    scale = E ** -0.5
    whole = attend_dense(q, k, v, p.dense(), mask, scale=scale, dropatt=0.0)
    got = attend_blocked(q, k, v, p, mask, scale=scale, block_bytes=block_bytes)
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)


def test_attend_takes_the_blocked_path_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def spy(*args, **kwargs):
        calls.append(1)
        return attend_blocked(*args, **kwargs)

    monkeypatch.setattr(blocked_mod, "attend_blocked", spy)
    q, k, v, p = _inputs(2, 2, 3, 4, 4, shaw=False)
    mask, scale = _mask(3, 4, False), 0.5
    with torch.no_grad():
        attend(q, k, v, p, mask, scale=scale, dropatt=0.0)
        assert calls == [1]
        attend(q, k, v, p, mask, scale=scale, dropatt=0.1)  # attention dropout: P whole
        attend(q[:, :, :1], k[:, :, :5], v[:, :, :5], ShiftedScores(p.x[:, :2], p.y[:, :, :6], 2), mask[:1, :5],
               scale=scale, dropatt=0.0)  # one query: P whole
    x = p.x.clone().requires_grad_()
    out = attend(q, k, v, p._replace(x=x), mask, scale=scale, dropatt=0.0)  # a gradient: P whole
    assert calls == [1]
    out.sum().backward()
    assert x.grad is not None


def _plain_nll(model, segments, lengths) -> list[torch.Tensor]:
    """Per-token NLL of a text read in order on the plain path: with a gradient (P whole, explicit softmax), no
    inference cache, memories carried functionally."""
    mems, out = None, []
    for x, y in segments:
        res = model(x, y, mems, lengths=lengths)
        mems = res.mems
        out.append(res.nll.detach())
    return out


@pytest.mark.parametrize("attn_type,kw", [
    (0, {}), (0, dict(same_length=True)), (0, dict(clamp_len=5)), (0, dict(same_length=True, clamp_len=5)),
    (1, {}), (1, dict(same_length=True, clamp_len=5)), (2, {}), (3, {}),
])
def test_streamed_evaluation_equals_the_plain_path(attn_type: int, kw: dict, tiny_model,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory of 14 where training had 6 (Shaw's table, built for 6 + 4, is read past its end), blocks of one
    head so that every segment runs many; the first segment has no memory, the others a growing then full one."""
    monkeypatch.setattr(blocked_mod, "BLOCK_BYTES_ONE_THREAD", 1)
    monkeypatch.setattr(blocked_mod, "BLOCK_BYTES_THREADS", 1)
    model = tiny_model(attn_type=attn_type, tgt_len=4, mem_len=6 if attn_type != 3 else 0).eval()
    lengths = model.config.lengths(mem_len=14 if attn_type != 3 else 0, **kw)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, model.config.n_token, (2, 4 * 6 + 1), generator=gen)
    segments = [(tokens[:, i:i + 4], tokens[:, i + 1:i + 5]) for i in range(0, 24, 4)]
    want = _plain_nll(model, segments, lengths)
    rec = Recurrence(model, lengths)
    with torch.no_grad():
        got = [rec(x, y).nll for x, y in segments]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("l2, block", [(512 << 10, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 2 << 20),
                                       (32 << 20, 4 << 20), (0, 1 << 20)])
def test_one_threads_block_is_the_cores_l2_within_bounds(l2: int, block: int) -> None:
    """AMD Zen 3 (512 KiB of L2 a core), Zen 4 (1 MiB), an AMX Xeon (2 MiB), a huge L2, an unknown one."""
    assert blocked_mod.one_thread_block_bytes(l2) == block


def test_the_l2_size_is_read_from_sysfs(tmp_path) -> None:
    from transformer_xl.model.fastpath import cpu_caches

    caches = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"), ("3", "Unified", "105M")]
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert cpu_caches(tmp_path) == {1: 48 << 10, 2: 2 << 20, 3: 105 << 20}  # the instruction cache left out
    assert cpu_caches(tmp_path / "missing") == {}
