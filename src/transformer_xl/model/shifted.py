"""Training attention with the relative position term formed in the shift's own layout (paper Sec. 3.3, App. B).

With a gradient, the scores of a relative encoding are

    A = scale ((q + u) k^T + shift(X Y^T + d)) + mask        X = q + v: [H, B*Q, E], one row per query
                                                             Y: position keys, zero row in front, [H, E, K+1]

(:class:`transformer_xl.model.blocked.ShiftedScores` for the layout). :func:`attend_shifted` computes
``Dropout(softmax(A)) V`` and its gradients with one :class:`torch.autograd.Function` that does only what the
math needs:

* **forward**: ``scale`` multiplies ``q + u`` and ``X`` (``[.., E]``, a sixteenth of a ``[Q, K]`` tensor at
  ``E`` = 32, ``K`` = 256) instead of the scores; the causal mask is written into the ``[Q, K+1]`` blocks before
  ``X Y^T`` accumulates onto it (one ``baddbmm``: mask and position term in one pass, no pass to add the mask),
  and the content term accumulates onto the shifted view of those blocks (one more ``baddbmm``);
* **backward**: the gradient of the scores is written into new ``[Q, K+1]`` blocks at the shifted positions and
  only the ``Q`` elements the shift never reads are zeroed, where autograd's backward of a strided view fills the
  whole buffer with zeros and then copies into it; the gradients of ``X``, ``Y`` and ``d`` are then products over
  those blocks, and of ``q + u``, ``k`` over the shifted view of them.

What autograd keeps is what :func:`~transformer_xl.model.fastpath.attend_explicit` keeps: the probabilities
``[B, H, Q, K]`` (and a 1-byte dropout mask with ``dropatt``), plus ``[.., E]`` inputs. Tested equal to the plain
formula in values and in every gradient (``tests/model/test_shifted.py``); chosen by
:func:`transformer_xl.model.dispatch.choose` for training on the CPU.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``K`` key length, ``E`` d_head.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from transformer_xl.model.blocked import padded_mask
from transformer_xl.model.fastpath import keep_mask, zero_row_in_front


def _shifted(blocks: Tensor, qlen: int) -> Tensor:
    """The shift of Appendix B as a view: ``[H, B*Q, K+1]`` blocks -> ``[H*B, Q, K]`` (``out[n, i, j]`` at element
    ``Q + i K + j`` of block ``n``; :func:`transformer_xl.model.fastpath.shift_padded`)."""
    n_head, rows, k1 = blocks.shape
    return blocks.view(n_head * rows // qlen, qlen * k1)[:, qlen:].view(-1, qlen, k1 - 1)


class _ShiftedAttention(torch.autograd.Function):
    """``Dropout(softmax(scale ((q + u) k^T + shift(X Y^T + d)) + mask)) v`` (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, x: Tensor, y: Tensor, d: Tensor | None,
                mask_bias: Tensor, scale: float, dropatt: float) -> Tensor:
        bsz, n_head, qlen, d_head = q.shape
        klen, hb = k.size(2), n_head * bsz
        qs = torch.mul(q.transpose(0, 1), scale, out=q.new_empty(n_head, bsz, qlen, d_head)).view(hb, qlen, d_head)
        xs = torch.mul(x.transpose(0, 1), scale, out=q.new_empty(n_head, bsz, qlen, d_head))
        xs = xs.view(n_head, bsz * qlen, d_head)  # [H, BQ, E]: scale (q + v); qs [HB, Q, E]: scale (q + u)
        ks = k.transpose(0, 1).reshape(hb, klen, d_head)  # [HB, K, E]
        vs = v.transpose(0, 1).reshape(hb, klen, d_head)  # [HB, K, E]
        yk = zero_row_in_front(y).permute(1, 2, 0)  # [H, E, K+1]: distances K..0, the first a zero row
        init = padded_mask(mask_bias.to(q.dtype), bsz)  # [BQ, K+1]
        if d is not None:  # a bias per distance (Shaw et al.): scale d, zero in front
            init = init + scale * zero_row_in_front(d).t()[:, None, :]  # [H, BQ, K+1]
        blocks = torch.baddbmm(init, xs, yk)  # [H, BQ, K+1]: mask + scale (b)+(d), unshifted (init broadcast)
        scores = torch.baddbmm(_shifted(blocks, qlen), qs, ks.transpose(1, 2))  # [HB, Q, K]: + scale (a)+(c)
        del blocks
        prob = torch.softmax(scores, -1)  # [HB, Q, K]
        del scores
        keep = None
        if dropatt > 0.0:
            # equivalent mutants: the path is the CPU's (dispatch), the device argument's default
            keep = keep_mask(prob.shape, dropatt, prob.device)  # pragma: no mutate  # [HB, Q, K] bool
            out = torch.bmm(prob * keep * (1.0 / (1.0 - dropatt)), vs)
        else:
            out = torch.bmm(prob, vs)  # [HB, Q, E]
        ctx.save_for_backward(qs, ks, vs, xs, yk, prob, keep)
        ctx.scale, ctx.dropatt, ctx.qlen, ctx.has_d = scale, dropatt, qlen, d is not None
        return out.view(n_head, bsz, qlen, d_head).transpose(0, 1)  # [B, H, Q, E]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        qs, ks, vs, xs, yk, prob, keep = ctx.saved_tensors
        scale, qlen = ctx.scale, ctx.qlen
        hb, _, d_head = qs.shape
        n_head, klen = xs.size(0), ks.size(1)
        bsz = hb // n_head
        g = grad.transpose(0, 1).reshape(hb, qlen, d_head)  # [HB, Q, E]
        dropped = prob if keep is None else prob * keep * (1.0 / (1.0 - ctx.dropatt))
        grad_v = torch.bmm(dropped.transpose(1, 2), g)  # [HB, K, E]
        del dropped
        grad_p = torch.bmm(g, vs.transpose(1, 2))  # [HB, Q, K]
        if keep is not None:
            grad_p.mul_(keep).mul_(1.0 / (1.0 - ctx.dropatt))
        grad_s = torch._softmax_backward_data(grad_p, prob, -1, prob.dtype)  # [HB, Q, K]: d loss / d A
        del grad_p
        # d A / d blocks is the shift: the gradient goes back to the positions the shift read; the first Q elements
        # of each block were never read (gradient 0)
        blocks = grad_s.new_empty(n_head, bsz * qlen, klen + 1)
        shifted = _shifted(blocks, qlen)  # [HB, Q, K] view
        shifted.copy_(grad_s)
        del grad_s
        blocks.view(hb, -1)[:, :qlen].zero_()
        need = ctx.needs_input_grad
        grad_q = torch.bmm(shifted, ks).mul_(scale) if need[0] else None  # [HB, Q, E]
        grad_k = torch.bmm(shifted.transpose(1, 2), qs) if need[1] else None  # [HB, K, E]
        grad_x = torch.bmm(blocks, yk.transpose(1, 2)).mul_(scale) if need[3] else None  # [H, BQ, E]
        grad_y = torch.bmm(xs.transpose(1, 2), blocks)[:, :, 1:].permute(2, 0, 1) if need[4] else None  # [K, H, E]
        grad_d = blocks.sum(1)[:, 1:].t().mul(scale) if ctx.has_d and need[5] else None  # [K, H]

        def bhqe(t: Tensor | None, length: int) -> Tensor | None:
            return None if t is None else t.view(n_head, bsz, length, d_head).transpose(0, 1)

        return (bhqe(grad_q, qlen), bhqe(grad_k, klen), bhqe(grad_v, klen), bhqe(grad_x, qlen), grad_y, grad_d,
                None, None, None)


def attend_shifted(q: Tensor, k: Tensor, v: Tensor, x: Tensor, y: Tensor, d: Tensor | None, mask_bias: Tensor, *,
                   scale: float, dropatt: float) -> Tensor:
    """``Dropout(softmax(scale ((q + u) k^T + P) + mask_bias)) v``, ``[B, H, Q, E]``, for a recorded gradient, with
    ``P = rel_shift(x y^T + d)`` given as its factors (:class:`transformer_xl.model.positional.PositionScores`:
    ``x [B, H, Q, E]``, ``y [K, H, E]``, ``d [K, H]`` or None), ``q [B, H, Q, E]`` (with ``u`` added),
    ``k, v [B, H, K, E]`` and ``mask_bias [Q, K]``, all of one type; under autocast every input is cast to the
    autocast type first (the products run in it, as autocast would run them)."""
    device = q.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        q, k, v, x, y = (t.to(dtype) for t in (q, k, v, x, y))
        d = None if d is None else d.to(dtype)
        # equivalent mutants: every input is in the autocast type already (its casts are no-ops); off so that no
        # autocast policy can change the function's types
        with torch.autocast(device, enabled=False):  # pragma: no mutate
            return _ShiftedAttention.apply(q, k, v, x, y, d, mask_bias, scale, dropatt)
    return _ShiftedAttention.apply(q, k, v, x, y, d, mask_bias, scale, dropatt)
