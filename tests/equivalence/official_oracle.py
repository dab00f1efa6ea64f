"""Test-only oracle: a slow, literal, time-first re-implementation of the official ``MemTransformerLM``.

Written from the semantics of kimiyoung/transformer-xl ``pytorch/mem_transformer.py`` and
``pytorch/utils/proj_adaptive_softmax.py`` (no code copied), deliberately *unlike* ``txl``:

* time-first tensors ``[len, bsz, ...]`` and official parameter names / state-dict layout;
* relative position terms by an explicit gather over distances: query ``i`` sits at key position
  ``mlen + i``, key ``j`` is at distance ``d = mlen + i - j`` (no pad/reshape shift trick);
* explicit boolean masks filled with ``-inf`` and a plain softmax (no ``scaled_dot_product_attention``);
* the adaptive softmax builds the full ``[N, n_token]`` log-distribution (head log-softmax, plus
  ``head[:, -i] + tail_i`` for tail cluster ``i``) and then gathers the targets, in original order.

Official quirks replicated on purpose (each documented where it is implemented):

* attn_type 2/3 with ``pre_lnorm``: keys/values from ``LN([mems; h])``, queries from the *un-normalized* ``h``;
* attn_type 2: the first layer's memory gets ``+ pos_emb[:mlen]`` and that *mutated* memory is what the
  memory update concatenates (official in-place ``mems_i += ...``); attn_type 3 likewise for every layer,
  and the stored hidden state of layer ``l`` includes its ``r_emb`` addition;
* attn_type 1: distances beyond the (clamped) table reuse its first row;
* the memory update uses the documented formula ``end = mlen + max(0, qlen - ext_len)``; the official
  call site swaps ``qlen``/``mlen``: ``update_mems(..., official_call_site_swap=True)`` reproduces it.

Not supported (not needed for the equivalence tests): dropout > 0 and ``sample_softmax > 0`` (the
official model has no ``crit`` then, and its evaluation path fails).

``untie_r`` (not in the official PyTorch code; a TF / Hugging Face option) is supported for attn_type 0 by
indexing ``r_w_bias``/``r_r_bias`` per layer when they are 3-D ``[n_layer, n_head, d_head]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

#: Keyword defaults of the official ``MemTransformerLM.__init__``.
OFFICIAL_DEFAULTS: dict[str, Any] = {
    "tie_weight": True, "d_embed": None, "div_val": 1, "tie_projs": [False], "pre_lnorm": False,
    "tgt_len": None, "ext_len": None, "mem_len": None, "cutoffs": [], "adapt_inp": False,
    "same_length": False, "attn_type": 0, "clamp_len": -1, "sample_softmax": -1,
}
REQUIRED = ("n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner", "dropout", "dropatt")
#: Accepted although not an official constructor argument.
EXTRA_KWARGS = ("untie_r",)
#: Buffers of the official model that may be present in (and are ignored by) the state dict.
BUFFERS = ("pos_emb.inv_freq",)
LN_EPS = 1e-5  # nn.LayerNorm default, used by every official LayerNorm


class OfficialOracle:
    """Official-format Transformer-XL forward: ``oracle(data [Q,B], target [T,B], mems) -> (loss [T,B], mems)``.

    ``state_dict`` uses the official names; tied names (``tie_weight``, ``tie_projs``) must hold equal
    values and are bound to one leaf tensor, so :meth:`grad` returns the total gradient of a shared
    parameter under each of its names, as the official model would accumulate it.
    """

    def __init__(self, kwargs: dict[str, Any], state_dict: dict[str, Tensor] | None, *,
                 dtype: torch.dtype | None = None) -> None:
        unknown = set(kwargs) - set(REQUIRED) - set(OFFICIAL_DEFAULTS) - set(EXTRA_KWARGS)
        if unknown:
            raise ValueError(f"not an official MemTransformerLM argument: {sorted(unknown)}")
        missing = [k for k in REQUIRED if k not in kwargs]
        if missing:
            raise ValueError(f"missing official arguments: {missing}")
        kw = {**OFFICIAL_DEFAULTS, **kwargs}
        self.kwargs = kw
        self.n_token, self.n_layer = int(kw["n_token"]), int(kw["n_layer"])
        self.n_head, self.d_head, self.d_model = int(kw["n_head"]), int(kw["d_head"]), int(kw["d_model"])
        self.d_inner = int(kw["d_inner"])
        self.d_embed = self.d_model if kw["d_embed"] is None else int(kw["d_embed"])
        self.div_val = int(kw["div_val"])
        self.cutoffs = [int(c) for c in kw["cutoffs"]]
        self.tie_weight = bool(kw["tie_weight"])
        self.tie_projs = [bool(t) for t in (kw["tie_projs"] or [])]
        self.pre_lnorm = bool(kw["pre_lnorm"])
        self.attn_type = int(kw["attn_type"])
        self.same_length = bool(kw["same_length"])
        self.clamp_len = int(kw["clamp_len"])
        self.tgt_len, self.ext_len, self.mem_len = int(kw["tgt_len"]), int(kw["ext_len"]), int(kw["mem_len"])
        self.max_klen = self.tgt_len + self.ext_len + self.mem_len  # fixed at construction (official)
        if float(kw["dropout"]) != 0.0 or float(kw["dropatt"]) != 0.0:
            raise NotImplementedError("the oracle is deterministic: dropout and dropatt must be 0")
        if int(kw["sample_softmax"]) > 0:
            raise NotImplementedError("sample_softmax > 0 is not supported by the oracle")
        self.bounds = list(zip([0, *self.cutoffs], [*self.cutoffs, self.n_token]))
        self.n_clusters = len(self.cutoffs)

        shapes, aliases = self.official_layout()
        self.aliases = aliases
        if state_dict is None:
            state_dict = self.random_state_dict(seed=0)
        names = set(state_dict) - set(BUFFERS)
        expected = set(shapes) | set(aliases)
        if names != expected:
            raise ValueError(f"state dict does not have the official keys: missing {sorted(expected - names)}, "
                             f"unexpected {sorted(names - expected)}")
        for name, shape in shapes.items():
            if tuple(state_dict[name].shape) != shape:
                raise ValueError(f"{name}: official shape {shape}, got {tuple(state_dict[name].shape)}")
        for alias, target in aliases.items():
            if not torch.equal(state_dict[alias], state_dict[target]):
                raise ValueError(f"tied official parameters {alias} and {target} differ")
        first = next(iter(state_dict.values()))
        self.dtype = dtype or first.dtype
        self.params: dict[str, Tensor] = {
            n: state_dict[n].detach().clone().to(self.dtype).requires_grad_(True) for n in shapes
        }
        if "pos_emb.inv_freq" in state_dict:
            self.inv_freq = state_dict["pos_emb.inv_freq"].detach().clone().to(self.dtype)
        else:
            self.inv_freq = 1.0 / (10000 ** (torch.arange(0.0, self.d_model, 2.0, dtype=torch.float64)
                                             / self.d_model)).to(self.dtype)

    # ------------------------------------------------------------------ parameters
    def official_layout(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """(shape of every distinct official parameter, tied name -> the name it shares storage with)."""
        L, H, E, D, d_in = self.n_layer, self.n_head, self.d_head, self.d_model, self.d_inner
        shapes: dict[str, tuple[int, ...]] = {}
        aliases: dict[str, str] = {}
        emb_dims = [self.d_embed // self.div_val**i for i in range(len(self.bounds))]
        # adaptive input
        if self.div_val == 1:
            shapes["word_emb.emb_layers.0.weight"] = (self.n_token, self.d_embed)
            if self.d_embed != D:
                shapes["word_emb.emb_projs.0"] = (D, self.d_embed)
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                shapes[f"word_emb.emb_layers.{i}.weight"] = (hi - lo, emb_dims[i])
                shapes[f"word_emb.emb_projs.{i}"] = (D, emb_dims[i])
        # layers
        for li in range(L):
            p = f"layers.{li}."
            if self.attn_type in (0, 1):
                shapes[p + "dec_attn.qkv_net.weight"] = (3 * H * E, D)
                if self.attn_type == 0:
                    shapes[p + "dec_attn.r_net.weight"] = (H * E, D)
            else:
                shapes[p + "dec_attn.q_net.weight"] = (H * E, D)
                shapes[p + "dec_attn.kv_net.weight"] = (2 * H * E, D)
            shapes[p + "dec_attn.o_net.weight"] = (D, H * E)
            shapes[p + "dec_attn.layer_norm.weight"] = (D,)
            shapes[p + "dec_attn.layer_norm.bias"] = (D,)
            shapes[p + "pos_ff.CoreNet.0.weight"] = (d_in, D)
            shapes[p + "pos_ff.CoreNet.0.bias"] = (d_in,)
            shapes[p + "pos_ff.CoreNet.3.weight"] = (D, d_in)
            shapes[p + "pos_ff.CoreNet.3.bias"] = (D,)
            shapes[p + "pos_ff.layer_norm.weight"] = (D,)
            shapes[p + "pos_ff.layer_norm.bias"] = (D,)
        # position parameters
        if self.attn_type == 0:
            untie = bool(self.kwargs.get("untie_r", False))
            bias_shape = (L, H, E) if untie else (H, E)
            shapes["r_w_bias"] = bias_shape
            shapes["r_r_bias"] = bias_shape
        elif self.attn_type == 1:
            shapes["r_emb"] = (L, self.max_klen, H, E)
            shapes["r_w_bias"] = (L, H, E)
            shapes["r_bias"] = (L, self.max_klen, H)
        elif self.attn_type == 3:
            shapes["r_emb"] = (L, self.max_klen, H, E)
        # projected adaptive softmax
        if self.n_clusters:
            shapes["crit.cluster_weight"] = (self.n_clusters, self.d_embed)
            shapes["crit.cluster_bias"] = (self.n_clusters,)
        if self.div_val == 1:
            if self.d_embed != D:
                for i in range(len(self.bounds)):
                    shapes[f"crit.out_projs.{i}"] = (D, self.d_embed)
            shapes["crit.out_layers.0.weight"] = (self.n_token, self.d_embed)
            shapes["crit.out_layers.0.bias"] = (self.n_token,)
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                shapes[f"crit.out_projs.{i}"] = (D, emb_dims[i])
                shapes[f"crit.out_layers.{i}.weight"] = (hi - lo, emb_dims[i])
                shapes[f"crit.out_layers.{i}.bias"] = (hi - lo,)
        # official tying rules (MemTransformerLM.__init__)
        if self.tie_weight:
            n_out = 1 if self.div_val == 1 else len(self.bounds)
            for i in range(n_out):
                aliases[f"crit.out_layers.{i}.weight"] = f"word_emb.emb_layers.{i}.weight"
        for i, tie in enumerate(self.tie_projs):
            if tie and self.div_val == 1 and self.d_embed != D:
                aliases[f"crit.out_projs.{i}"] = "word_emb.emb_projs.0"
            elif tie and self.div_val != 1:
                aliases[f"crit.out_projs.{i}"] = f"word_emb.emb_projs.{i}"
        for alias in aliases:
            shapes.pop(alias, None)
        return shapes, aliases

    def random_state_dict(self, *, seed: int, std: float = 0.3,
                          dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
        """An official-format state dict drawn at random (tied names share one tensor, as officially)."""
        gen = torch.Generator().manual_seed(seed)
        shapes, aliases = self.official_layout()
        state = {}
        for name, shape in shapes.items():
            t = torch.randn(shape, generator=gen, dtype=torch.float64) * std
            if name.endswith("layer_norm.weight"):
                t = t + 1.0
            state[name] = t.to(dtype)
        for alias, target in aliases.items():
            state[alias] = state[target]
        return state

    def official_init_state_dict(self, *, seed: int, init_std: float = 0.02, proj_init_std: float = 0.01,
                                 dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
        """An official-format state dict drawn as the official ``train.py`` ``weights_init`` (``--init normal``)
        does: weights, embeddings, ``cluster_weight``, ``r_emb``, ``r_w_bias``, ``r_r_bias`` ~ N(0, init_std);
        biases (``r_bias``, ``cluster_bias`` included) 0; projections ~ N(0, proj_init_std); LayerNorm weights
        ~ N(1, init_std). Tied names share one tensor."""
        gen = torch.Generator().manual_seed(seed)
        shapes, aliases = self.official_layout()
        state = {}
        for name, shape in shapes.items():
            noise = torch.randn(shape, generator=gen, dtype=torch.float64)
            if name.endswith("bias") and not name.endswith(("r_w_bias", "r_r_bias")):
                t = torch.zeros(shape, dtype=torch.float64)
            elif "_projs." in name:
                t = noise * proj_init_std
            elif name.endswith("layer_norm.weight"):
                t = 1.0 + noise * init_std
            else:
                t = noise * init_std
            state[name] = t.to(dtype)
        for alias, target in aliases.items():
            state[alias] = state[target]
        return state

    def p(self, name: str) -> Tensor:
        return self.params[self.aliases.get(name, name)]

    def has(self, name: str) -> bool:
        return self.aliases.get(name, name) in self.params

    def grad(self, name: str) -> Tensor | None:
        """Gradient under an official name (the shared total for tied names)."""
        return self.p(name).grad

    def zero_grad(self) -> None:
        for t in self.params.values():
            t.grad = None

    def reset_length(self, tgt_len: int, ext_len: int, mem_len: int) -> None:
        """Official ``reset_length``: parameter shapes (``max_klen``) stay those of construction."""
        self.tgt_len, self.ext_len, self.mem_len = tgt_len, ext_len, mem_len

    # ------------------------------------------------------------------ building blocks
    @staticmethod
    def _ln(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + LN_EPS) * w + b

    def _sinusoid(self, pos: Tensor) -> Tensor:
        """``[*pos.shape, d_model]`` = ``[sin(pos * f), cos(pos * f)]``."""
        ang = pos.to(self.dtype)[..., None] * self.inv_freq
        return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)

    def _embed(self, data: Tensor) -> Tensor:
        """Adaptive input ``[Q, B] -> [Q, B, D]`` scaled by ``sqrt(d_model)``."""
        if self.div_val == 1:
            emb = self.p("word_emb.emb_layers.0.weight")[data]
            if self.has("word_emb.emb_projs.0"):
                emb = emb @ self.p("word_emb.emb_projs.0").t()
        else:
            emb = torch.zeros(*data.shape, self.d_model, dtype=self.dtype)
            for i, (lo, hi) in enumerate(self.bounds):
                table = self.p(f"word_emb.emb_layers.{i}.weight")
                proj = self.p(f"word_emb.emb_projs.{i}")
                in_i = (data >= lo) & (data < hi)
                rows = table[(data - lo).clamp(0, hi - lo - 1)] @ proj.t()  # every token, then select
                emb = torch.where(in_i[..., None], rows, emb)
        return emb * math.sqrt(self.d_model)

    def _mask(self, qlen: int, mlen: int) -> Tensor:
        """Boolean ``[Q, K]``, True = masked: future keys, and with ``same_length`` keys too far back."""
        klen = qlen + mlen
        i = torch.arange(qlen)[:, None]
        j = torch.arange(klen)[None, :]
        mask = j > mlen + i  # == triu(ones(qlen, klen), 1 + mlen)
        if self.same_length:
            mask_len = klen - self.mem_len
            shift = qlen - mask_len if mask_len > 0 else qlen
            mask = mask | (j <= i - shift)  # == tril(ones(qlen, klen), -shift)
        return mask

    def _attention(self, li: int, h: Tensor, mem: Tensor | None, mask: Tensor) -> Tensor:
        qlen, bsz, _ = h.shape
        H, E = self.n_head, self.d_head
        p = f"layers.{li}.dec_attn."
        c = h if mem is None or mem.size(0) == 0 else torch.cat([mem, h], 0)
        klen = c.size(0)
        mlen = klen - qlen
        ln_w, ln_b = self.p(p + "layer_norm.weight"), self.p(p + "layer_norm.bias")
        c_in = self._ln(c, ln_w, ln_b) if self.pre_lnorm else c
        if self.attn_type in (0, 1):  # relative: q, k, v all from (LN of) [mems; w]
            heads = c_in @ self.p(p + "qkv_net.weight").t()
            q, k, v = heads[..., : H * E], heads[..., H * E : 2 * H * E], heads[..., 2 * H * E :]
            q = q[-qlen:]
        else:  # absolute: q from the un-normalized h even with pre_lnorm (official quirk)
            q = h @ self.p(p + "q_net.weight").t()
            kv = c_in @ self.p(p + "kv_net.weight").t()
            k, v = kv[..., : H * E], kv[..., H * E :]
        q = q.reshape(qlen, bsz, H, E)
        k = k.reshape(klen, bsz, H, E)
        v = v.reshape(klen, bsz, H, E)

        # distance of every (query, key) pair; negative = future key (masked)
        dist = mlen + torch.arange(qlen)[:, None] - torch.arange(klen)[None, :]  # [Q, K]
        if self.attn_type == 0:
            r_w_bias, r_r_bias = self.p("r_w_bias"), self.p("r_r_bias")
            if r_w_bias.dim() == 3:  # untie_r
                r_w_bias, r_r_bias = r_w_bias[li], r_r_bias[li]
            pos = dist.clamp(min=0)
            if self.clamp_len > 0:
                pos = pos.clamp(max=self.clamp_len)
            r = self._sinusoid(pos)  # [Q, K, D]: R_{d(i, j)} for every pair
            r_k = (r @ self.p(p + "r_net.weight").t()).reshape(qlen, klen, H, E)  # W_kR R
            ac = torch.einsum("ibhe,jbhe->ijbh", q + r_w_bias, k)
            bd = torch.einsum("ibhe,ijhe->ijbh", q + r_r_bias, r_k)
            score = ac + bd
        elif self.attn_type == 1:
            table, bias_table = self.p("r_emb")[li], self.p("r_bias")[li]  # [R, H, E], [R, H]
            if self.clamp_len > 0:
                table, bias_table = table[-self.clamp_len :], bias_table[-self.clamp_len :]
            n = table.size(0)
            # last row = distance 0, row n-1-d = distance d; farther distances use row 0 (official pad)
            row = (n - 1 - dist).clamp(min=0, max=n - 1)  # [Q, K]
            ac = torch.einsum("ibhe,jbhe->ijbh", q + self.p("r_w_bias")[li], k)
            b = torch.einsum("ibhe,ijhe->ijbh", q, table[row])
            d = bias_table[row][:, :, None, :]  # [Q, K, 1, H]
            score = ac + b + d
        else:
            score = torch.einsum("ibhe,jbhe->ijbh", q, k)
        score = score * (1.0 / math.sqrt(E))
        score = score.masked_fill(mask[:, :, None, None], float("-inf"))
        prob = torch.softmax(score, dim=1)  # over keys
        vec = torch.einsum("ijbh,jbhe->ibhe", prob, v).reshape(qlen, bsz, H * E)
        out = vec @ self.p(p + "o_net.weight").t()
        return h + out if self.pre_lnorm else self._ln(h + out, ln_w, ln_b)

    def _ff(self, li: int, x: Tensor) -> Tensor:
        p = f"layers.{li}.pos_ff."
        ln_w, ln_b = self.p(p + "layer_norm.weight"), self.p(p + "layer_norm.bias")

        def core(y: Tensor) -> Tensor:
            hidden = torch.relu(y @ self.p(p + "CoreNet.0.weight").t() + self.p(p + "CoreNet.0.bias"))
            return hidden @ self.p(p + "CoreNet.3.weight").t() + self.p(p + "CoreNet.3.bias")

        if self.pre_lnorm:
            return x + core(self._ln(x, ln_w, ln_b))
        return self._ln(x + core(x), ln_w, ln_b)

    def _logit(self, hidden: Tensor, weight: Tensor, bias: Tensor, proj: Tensor | None) -> Tensor:
        if proj is not None:
            hidden = hidden @ proj  # official F.linear(hidden, proj.t())
        return hidden @ weight.t() + bias

    def _cluster(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.div_val == 1:
            lo, hi = self.bounds[i]
            w = self.p("crit.out_layers.0.weight")[lo:hi]
            b = self.p("crit.out_layers.0.bias")[lo:hi]
        else:
            w, b = self.p(f"crit.out_layers.{i}.weight"), self.p(f"crit.out_layers.{i}.bias")
        proj = self.p(f"crit.out_projs.{i}") if self.has(f"crit.out_projs.{i}") else None
        return w, b, proj

    def log_probs(self, hidden: Tensor) -> Tensor:
        """Full next-token log-distribution ``[N, n_token]`` from ``hidden [N, D]``."""
        w0, b0, proj0 = self._cluster(0)
        if not self.n_clusters:
            return torch.log_softmax(self._logit(hidden, w0, b0, proj0), dim=-1)
        head_w = torch.cat([w0, self.p("crit.cluster_weight")], 0)
        head_b = torch.cat([b0, self.p("crit.cluster_bias")], 0)
        head = torch.log_softmax(self._logit(hidden, head_w, head_b, proj0), dim=-1)  # [N, S + C]
        shortlist = self.bounds[0][1]
        parts = [head[:, :shortlist]]
        for i in range(1, len(self.bounds)):
            tail = torch.log_softmax(self._logit(hidden, *self._cluster(i)), dim=-1)
            col = head.size(1) - i  # official head_logprob[:, -i]: cluster columns in reverse order
            parts.append(head[:, col : col + 1] + tail)
        return torch.cat(parts, dim=1)

    # ------------------------------------------------------------------ model
    def update_mems(self, hids: list[Tensor], mems: list[Tensor], qlen: int, mlen: int, *,
                    official_call_site_swap: bool = False) -> list[Tensor]:
        """Keep positions ``[end - mem_len, end)`` of ``[mem_l; hid_l]``, ``end = mlen + max(0, qlen - ext_len)``.

        ``official_call_site_swap`` evaluates the formula with ``qlen`` and ``mlen`` exchanged, as the
        official ``_forward`` calls ``_update_mems(hids, mems, mlen, qlen)`` against its signature.
        """
        if official_call_site_swap:
            qlen, mlen = mlen, qlen
        end = mlen + max(0, qlen - self.ext_len)
        beg = max(0, end - self.mem_len)
        return [torch.cat([m, h], 0)[beg:end].detach() for m, h in zip(mems, hids)]

    def forward(self, data: Tensor, target: Tensor, mems: list[Tensor] | None = None, *,
                official_call_site_swap: bool = False) -> tuple[Tensor, list[Tensor]]:
        """``data [Q, B]``, ``target [T, B]``, ``mems``: ``n_layer + 1`` tensors ``[M, B, D]`` (or empty).

        Returns the per-token NLL ``[T, B]`` of the last ``T`` positions, in original order, and the
        new memories (``[]`` when ``mem_len`` is 0, as the official model then keeps none).
        """
        qlen, bsz = data.shape
        D = self.d_model
        if self.mem_len > 0 and not mems:
            mems = [torch.zeros(0, bsz, D, dtype=self.dtype) for _ in range(self.n_layer + 1)]
        if self.mem_len == 0:
            mems = []
        mems = [m.to(self.dtype) for m in mems]
        mlen = mems[0].size(0) if mems else 0
        klen = mlen + qlen
        mask = self._mask(qlen, mlen)
        word_emb = self._embed(data)
        mems_used = list(mems)  # memories as the official in-place additions leave them
        hids: list[Tensor] = []

        if self.attn_type in (0, 1):
            core = word_emb
            for li in range(self.n_layer):
                hids.append(core)
                core = self._ff(li, self._attention(li, core, mems[li] if mems else None, mask))
        elif self.attn_type == 2:
            pos = torch.arange(klen - 1, -1, -1)  # positions of [mems; segment]: klen-1 .. 0
            if self.clamp_len > 0:
                pos = pos.clamp(max=self.clamp_len)
            table = self._sinusoid(pos)  # [K, D]
            core = word_emb + table[mlen:][:, None, :]  # == pos_emb[-qlen:]
            for li in range(self.n_layer):
                mem = mems[li] if mems else None
                if li == 0 and mem is not None and mlen > 0:
                    mem = mem + table[:mlen][:, None, :]  # official `mems_i += pos_emb[:mlen]`
                    mems_used[0] = mem
                hids.append(core)
                core = self._ff(li, self._attention(li, core, mem, mask))
        else:  # attn_type 3
            core = word_emb
            for li in range(self.n_layer):
                table = self.p("r_emb")[li].reshape(self.max_klen, -1)  # [R, D] (n_head * d_head == d_model)
                mem = mems[li] if mems else None
                if mem is not None and mlen > 0:
                    cur = table[: table.size(0) - qlen]  # rows before the segment's (official r_emb[i][:-qlen])
                    if cur.size(0) < mlen:
                        cur = torch.cat([cur[:1].expand(mlen - cur.size(0), -1), cur], 0)
                    else:
                        cur = cur[cur.size(0) - mlen :]
                    mem = mem + cur[:, None, :]  # official in-place `mems_i += cur_emb`
                    mems_used[li] = mem
                core = core + table[table.size(0) - qlen :][:, None, :]  # in place officially: kept in hids
                hids.append(core)
                core = self._ff(li, self._attention(li, core, mem, mask))
        hids.append(core)

        new_mems = (self.update_mems(hids, mems_used, qlen, mlen, official_call_site_swap=official_call_site_swap)
                    if mems else [])
        tlen = target.size(0)
        pred = core[qlen - tlen :].reshape(tlen * bsz, D)
        logp = self.log_probs(pred)  # [T * B, n_token]
        nll = -logp.gather(1, target.reshape(-1, 1)).squeeze(1)
        return nll.view(tlen, bsz), new_mems

    __call__ = forward


def official_train_losses(oracle: OfficialOracle, train_ids: Tensor, *, batch_size: int, max_step: int, lr: float,
                          clip: float, eta_min: float = 0.0) -> list[float]:
    """The per-step training losses of the official ``train.py`` loop (``--optim adam --scheduler cosine
    --warmup_step 0``, no dropout, ``batch_chunk`` 1) over ``oracle``'s parameters, written from its semantics:

    * batches: ``LMOrderedIterator`` (the stream cut into ``batch_size`` rows, time-first; segment ``i`` is
      ``data[max(0, i - ext_len) : i + seq_len]``, target ``data[i + 1 : i + 1 + seq_len]``, ``seq_len =
      min(tgt_len, n - 1 - i)``); each epoch (one ``train()`` call) starts with no memory;
    * each step: ``loss = nll.float().mean()``, ``backward``, ``clip_grad_norm_(parameters, clip)``, Adam, then
      ``scheduler.step(train_step)`` of ``CosineAnnealingLR(T_max=max_step, eta_min)`` (its closed form).
    """
    params = list(oracle.params.values())
    optimizer = torch.optim.Adam(params, lr=lr)
    n_step = train_ids.numel() // batch_size
    data = train_ids[: n_step * batch_size].reshape(batch_size, n_step).t().contiguous()  # [n_step, bsz]
    bptt, ext_len = oracle.tgt_len, oracle.ext_len
    losses: list[float] = []
    while True:
        mems: list[Tensor] = []
        for i in range(0, data.size(0) - 1, bptt):
            seq_len = min(bptt, data.size(0) - 1 - i)
            inp, target = data[max(0, i - ext_len) : i + seq_len], data[i + 1 : i + 1 + seq_len]
            oracle.zero_grad()
            nll, mems = oracle(inp, target, mems)
            loss = nll.float().mean()
            loss.backward()
            losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            step = len(losses)
            for group in optimizer.param_groups:
                group["lr"] = eta_min + (lr - eta_min) * (1 + math.cos(math.pi * step / max_step)) / 2
            if step == max_step:
                return losses
