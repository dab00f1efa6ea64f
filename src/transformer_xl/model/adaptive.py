"""Adaptive input embeddings, projected adaptive log-softmax and sampled softmax (paper Sec. 4).

Vocabulary clusters are ``[0, c_1), [c_1, c_2), ..., [c_n, n_token)`` for ``cutoffs = [c_1..c_n]``.
With ``div_val > 1`` cluster ``i`` has embedding size ``d_embed // div_val**i`` and its own projection
to ``d_model`` (Baevski & Auli, 2019; Grave et al., 2017).

Log-probability of token ``w`` in tail cluster ``i >= 1`` (official convention, kept exactly)::

    log p(w | h) = log_softmax(head(h))[-i] + log_softmax(tail_i(h))[w - c_i]

i.e. the head's cluster columns are in *reverse* cluster order (the official code reads column ``-i``),
so ``cluster_weight[n_clusters - i]`` scores cluster ``i``. Hugging Face's port orders them the other
way in its loss; :mod:`transformer_xl.interop.hf` reverses them on import/export.

Parameter names (``emb_layers``, ``emb_projs``, ``out_layers``, ``out_projs``, ``cluster_weight``,
``cluster_bias``, ``out_layer``) are the official ones. Shapes: ``N`` flattened tokens, ``D`` d_model.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.model import native
from transformer_xl.model.fastpath import cluster_embed, cluster_nll
from transformer_xl.model.int8 import int8_linear


def log_softmax32(logits: Tensor) -> Tensor:
    """``log_softmax`` over the last dim in at least float32 (half precision is upcast, float64 kept)."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _cluster_bounds(n_token: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    return list(pairwise([0, *cutoffs, n_token]))


class AdaptiveEmbedding(nn.Module):
    """Word embedding ``sqrt(d_model) * E[w] P`` with per-cluster sizes when ``div_val > 1``."""

    def __init__(self, n_token: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1,
                 sparse: bool = False) -> None:
        super().__init__()
        self.d_embed, self.d_proj, self.div_val = d_embed, d_proj, div_val
        self.bounds = _cluster_bounds(n_token, cutoffs)
        self.emb_scale = d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(n_token, d_embed, sparse=sparse))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, d_embed)))
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                d_i = d_embed // div_val**i
                self.emb_layers.append(nn.Embedding(hi - lo, d_i))
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, d_i)))

    def forward(self, ids: Tensor) -> Tensor:
        """``ids``: any shape of token ids -> ``[*ids.shape, d_proj]``."""
        if self.div_val == 1:
            emb = self.emb_layers[0](ids)
            if len(self.emb_projs):
                emb = native.linear(emb, self.emb_projs[0])
            return emb * self.emb_scale
        flat = ids.reshape(-1)
        param = self.emb_projs[0]
        out = torch.zeros(flat.numel(), self.d_proj, dtype=param.dtype, device=param.device)  # [N, D]
        out = cluster_embed(flat, self.bounds,
                            lambda ids, i: native.linear(self.emb_layers[i](ids), self.emb_projs[i]), out)
        return (out * self.emb_scale).view(*ids.shape, self.d_proj)


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Adaptive softmax with projections; a plain (optionally projected) softmax when there are no cutoffs.

    :meth:`nll` scores only the target of each row: the head for every row, a tail cluster only for
    the rows whose target falls in it, so the full ``[N, n_token]`` logits are never built.
    """

    def __init__(self, n_token: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1) -> None:
        super().__init__()
        self.n_token, self.div_val = n_token, div_val
        self.bounds = _cluster_bounds(n_token, cutoffs)
        self.shortlist = self.bounds[0][1]
        self.n_clusters = len(cutoffs)
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()  # all clusters projected, or none (div_val 1, d_proj == d_embed)
        if div_val == 1:
            if d_proj != d_embed:
                for _ in self.bounds:
                    self.out_projs.append(nn.Parameter(torch.zeros(d_proj, d_embed)))
            self.out_layers.append(nn.Linear(d_embed, n_token))
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                d_i = d_embed // div_val**i
                self.out_projs.append(nn.Parameter(torch.zeros(d_proj, d_i)))
                self.out_layers.append(nn.Linear(d_i, hi - lo))
        self.int8_logits: nn.ModuleList | None = None  # set by quantize()

    def cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight ``[V_i, d_i]``, bias and projection ``[D, d_i]`` of cluster ``i`` (the head's words for 0)."""
        if self.div_val == 1:
            lo, hi = self.bounds[i]
            weight, bias = self.out_layers[0].weight[lo:hi], self.out_layers[0].bias[lo:hi]
        else:
            weight, bias = self.out_layers[i].weight, self.out_layers[i].bias
        proj = self.out_projs[i] if len(self.out_projs) else None
        return weight, bias, proj

    def quantize(self) -> None:
        """int8 output weights for CPU inference (:mod:`transformer_xl.model.int8`): one int8 layer per cluster, the
        head's
        with the tail clusters' rows ``cluster_weight`` appended; projections and the (tied) input embedding
        keep their float weights."""
        layers = []
        for i in range(len(self.bounds)):
            weight, bias, _ = self.cluster_params(i)
            if i == 0 and self.n_clusters:
                weight = torch.cat([weight, self.cluster_weight], dim=0)
                bias = torch.cat([bias, self.cluster_bias], dim=0)
            layers.append(int8_linear(weight.detach(), bias.detach()))
        self.int8_logits = nn.ModuleList(layers)

    def _logit(self, hidden: Tensor, i: int) -> Tensor:
        """Logits ``[N, V_i]`` of cluster ``i``; the head's (``i = 0``) end with the tail clusters' columns
        ``cluster_weight`` (the logits are concatenated, not the weights: no copy of the head's matrix)."""
        weight, bias, proj = self.cluster_params(i)
        if proj is not None:
            hidden = native.linear(hidden, proj.t())  # [N, D] @ [D, d_i] -> [N, d_i]
        if self.int8_logits is not None:
            return self.int8_logits[i](hidden)
        logit = native.linear(hidden, weight, bias)
        if i == 0 and self.n_clusters:
            logit = torch.cat([logit, native.linear(hidden, self.cluster_weight, self.cluster_bias)], dim=-1)
        return logit

    def nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """Negative log-likelihood ``[N]`` of ``target [N]`` given ``hidden [N, D]``, in input order."""
        head_logprob = log_softmax32(self._logit(hidden, 0))
        if not self.n_clusters:
            return -head_logprob.gather(1, target[:, None]).squeeze(1)
        return cluster_nll(head_logprob, target, hidden, self.bounds, lambda h, i: log_softmax32(self._logit(h, i)))

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Full log-distribution ``[N, n_token]`` (for sampling and inspection; costs N x n_token)."""
        head_logprob = log_softmax32(self._logit(hidden, 0))
        if not self.n_clusters:
            return head_logprob
        parts = [head_logprob[:, : self.shortlist]]
        for i in range(1, len(self.bounds)):
            tail = log_softmax32(self._logit(hidden, i))
            parts.append(head_logprob[:, -i, None] + tail)
        return torch.cat(parts, dim=1)


class LogUniformSampler:
    """Negative sampler of the official code: log-uniform (Zipfian) over ids sorted by frequency.

    ``P(k) = (log(k + 2) - log(k + 1)) / log(n_token + 1)``; ``2 * n_sample`` draws with replacement,
    de-duplicated. ``log_q[k] = log(1 - (1 + P(k))^(-2 n_sample))`` (the official expression, close to the
    log-probability ``log(1 - (1 - P(k))^(2 n_sample))`` that ``k`` is drawn at least once) is subtracted
    from the logits (sampled softmax, Jean et al., 2015).
    """

    def __init__(self, n_token: int, n_sample: int) -> None:
        log_idx = torch.arange(1.0, n_token + 2.0).log()
        self.dist = (log_idx[1:] - log_idx[:-1]) / log_idx[-1]
        self.log_q = (-(-self.dist.double().log1p() * 2 * n_sample).expm1()).log().float()
        self.n_sample = n_sample

    def sample(self, n_draws: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        draws = 2 * self.n_sample if n_draws is None else n_draws
        return torch.multinomial(self.dist, draws, replacement=True, generator=generator).unique()


def sampled_logits(weight: Tensor, bias: Tensor, target: Tensor, hidden: Tensor, neg: Tensor,
                   log_q: Tensor) -> Tensor:
    """Logits ``[N, 1 + S]``: the true class in column 0, then the ``S`` shared negatives ``neg``.

    Negatives equal to the row's target are masked out (``-1e30``), as in the official ``sample_logits``.
    """
    log_q = log_q.to(hidden.device)
    true = (weight[target] * hidden).sum(-1) + bias[target] - log_q[target]  # [N]
    sampled = hidden @ weight[neg].t() + bias[neg] - log_q[neg]  # [N, S]
    sampled = sampled.masked_fill(target[:, None] == neg[None, :], -1e30)
    return torch.cat([true[:, None], sampled], dim=1)
