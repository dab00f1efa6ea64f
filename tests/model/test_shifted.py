"""The shifted training attention (:func:`transformer_xl.model.shifted.attend_shifted`) equals the paper's formula
(the plain path) in its output and in the gradient of every input, for both relative encodings, with and without a
memory, under ``same_length``, with attention dropout (against the explicit path, which draws the same mask), under
bf16 autocast, and keeps no more for backward than the explicit path; through the model it trains as the reference."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import saved_bytes, tiny_model
from transformer_xl.model import shifted
from transformer_xl.model.dispatch import attend
from transformer_xl.model.fastpath import attend_explicit
from transformer_xl.model.memory import additive_mask, causal_mask
from transformer_xl.model.positional import PositionScores
from transformer_xl.model.shifted import attend_shifted

CPU = torch.device("cpu")


def _inputs(qlen: int, mlen: int, shaw: bool, same_length: bool = False, seed: int = 0, batch: int = 2):
    gen = torch.Generator().manual_seed(seed)
    n_head, d_head, klen = 3, 4, qlen + mlen
    q, x = (torch.randn(batch, n_head, qlen, d_head, generator=gen, requires_grad=True) for _ in range(2))
    k, v = (torch.randn(batch, n_head, klen, d_head, generator=gen, requires_grad=True) for _ in range(2))
    y = torch.randn(klen, n_head, d_head, generator=gen, requires_grad=True)
    d = torch.randn(klen, n_head, generator=gen, requires_grad=True) if shaw else None
    mask = additive_mask(causal_mask(qlen=qlen, mlen=mlen, mem_len=max(mlen, 1), same_length=same_length,
                                     device=CPU), torch.float32)
    return q, k, v, x, y, d, mask


def _grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 9) -> list[torch.Tensor]:
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return list(torch.autograd.grad(out, inputs, g))


@pytest.mark.parametrize("shaw", [False, True])
@pytest.mark.parametrize("qlen,mlen,same_length", [(5, 4, False), (5, 0, False), (1, 6, False), (6, 3, True)])
def test_output_and_every_gradient_equal_the_plain_formula(shaw: bool, qlen: int, mlen: int,
                                                           same_length: bool) -> None:
    q, k, v, x, y, d, mask = _inputs(qlen, mlen, shaw, same_length)
    inputs = [t for t in (q, k, v, x, y, d) if t is not None]
    plain = attend(q, k, v, PositionScores(x, y, d), mask, scale=0.5, dropatt=0.0, plain=True)
    got = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0)
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(got, inputs), _grads(plain, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_backward_reads_no_uninitialized_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every element of the gradient's ``[Q, K+1]`` blocks is written before it is read: with fresh buffers full of
    NaN the gradients are still finite and equal (the ``Q`` elements the shift never reads must be zeroed)."""
    q, k, v, x, y, d, mask = _inputs(5, 4, shaw=True)
    inputs = [q, k, v, x, y, d]
    want = _grads(attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0), inputs)
    real = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *a, **kw: real(t, *a, **kw).fill_(float("nan")))
    got = _grads(attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0), inputs)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("shaw", [False, True])
def test_attention_dropout_equals_the_explicit_path_with_the_same_mask(shaw: bool) -> None:
    q, k, v, x, y, d, mask = _inputs(5, 4, shaw)
    inputs = [t for t in (q, k, v, x, y, d) if t is not None]
    torch.manual_seed(4)
    got = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.3)
    torch.manual_seed(4)
    want = attend_explicit(q, k, v, PositionScores(x, y, d).dense(), mask, scale=0.5, dropatt=0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(got, inputs), _grads(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.manual_seed(5)
    other = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.3)
    assert not torch.allclose(other, got)  # the mask is drawn, not fixed


@pytest.mark.parametrize("shaw", [False, True])
def test_bf16_autocast_computes_in_bf16_and_tracks_fp32(shaw: bool) -> None:
    q, k, v, x, y, d, mask = _inputs(6, 5, shaw=shaw)
    inputs = [t for t in (q, k, v, x, y, d) if t is not None]
    want = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)
    for a, b in zip(_grads(got.float(), inputs), _grads(want, inputs)):  # every input's gradient, d's included
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("needed", [(0,), (1,), (2,), (1, 2), (3,), (4,), (5,), (0, 1, 2, 3, 4, 5)])
def test_backward_computes_only_the_gradients_asked_for(needed: tuple[int, ...]) -> None:
    """Inputs that need no gradient (a frozen W_kR, Shaw's bias) get None and cost no product: each gradient of q, k,
    x, y is one bmm, d's one sum, and v's (with the probabilities' own) always two."""
    q, k, v, x, y, d, mask = _inputs(5, 4, shaw=True)
    inputs = [q, k, v, x, y, d]
    for i, t in enumerate(inputs):
        t.requires_grad_(i in needed)
    out = attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0)
    plain = attend(q, k, v, PositionScores(x, y, d), mask, scale=0.5, dropatt=0.0, plain=True)
    asked = [inputs[i] for i in needed]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    with _Count() as count:
        got = torch.autograd.grad(out, asked, g)
    for a, b in zip(got, torch.autograd.grad(plain, asked, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    products = sum(i in needed for i in (0, 1, 3, 4))  # q, k, x, y: one bmm each
    assert count.ops.count("bmm.default") == 2 + products  # + grad_v and the probabilities' gradient
    assert count.ops.count("sum.dim_IntList") == (5 in needed)


def test_keeps_no_more_for_backward_than_the_explicit_path() -> None:
    q, k, v, x, y, d, mask = _inputs(32, 32, shaw=False, batch=4)
    ours = saved_bytes(lambda: attend_shifted(q, k, v, x, y, d, mask, scale=0.5, dropatt=0.0))
    explicit = saved_bytes(lambda: attend_explicit(q, k, v, PositionScores(x, y, d).dense(), mask, scale=0.5,
                                                    dropatt=0.0))
    probs = 4 * 3 * 32 * 64 * 4  # the [B, H, Q, K] probabilities, which both keep
    zero_row = 3 * 4 * 4  # the position keys are kept with the zero row in front ([K+1] rows)
    assert probs <= ours <= explicit + zero_row


@pytest.mark.parametrize("attn_type", [0, 1])
def test_training_through_the_model_equals_the_reference(attn_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two training segments (memory carried) through the model, the shifted path taken in every layer: the loss and
    every parameter's gradient equal ``TransformerXLLM.reference()``'s."""
    calls: list[int] = []
    real = shifted._ShiftedAttention.apply
    monkeypatch.setattr(shifted._ShiftedAttention, "apply", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    model = tiny_model(attn_type=attn_type, dropout=0.0, dropatt=0.0).train()
    x = torch.randint(0, model.config.n_token, (2, 6))
    y = torch.randint(0, model.config.n_token, (2, 6))

    def losses_and_grads(reference: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
        model.reference(reference)
        model.zero_grad()
        mems, losses = None, []
        for _ in range(2):
            out = model(x, y, mems)
            out.loss.backward()
            mems, losses = out.mems, [*losses, out.loss.item()]
        return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want_losses, want = losses_and_grads(True)
    assert not calls
    got_losses, got = losses_and_grads(False)
    assert len(calls) == 2 * model.config.n_layer
    assert got_losses == pytest.approx(want_losses, rel=1e-6)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
