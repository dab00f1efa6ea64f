"""The Transformer-XL language model, batch-first (paper Sec. 3; official ``MemTransformerLM``).

``TransformerXLLM(config)(input_ids, targets=None, mems=None)`` runs one segment:

1. word embeddings (adaptive input, scaled by ``sqrt(d_model)``) plus what the position strategy adds;
2. ``n_layer`` decoder layers, layer ``n`` attending over ``[SG(m^{n-1}); h^{n-1}]`` (paper Sec. 3.2);
3. the (adaptive or sampled) softmax over the last ``targets.size(1)`` positions.

Memories are a list of ``n_layer + 1`` tensors ``[B, M, D]``: the input of every layer and the final
output (the last is kept, unused, for parity with the official code). ``targets[:, t]`` is the token to
predict at position ``t`` (aligned, no shift inside the model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from txl.adaptive import (
    AdaptiveEmbedding,
    LogUniformSampler,
    ProjectedAdaptiveLogSoftmax,
    log_softmax32,
    sampled_logits,
)
from txl.attention import DecoderLayer
from txl.config import TXLConfig
from txl.errors import CheckpointError, ConfigError
from txl.io import load_weights, save_weights
from txl.memory import cached_mask_bias, kept_range, update_mems
from txl.positional import build_positional


@dataclass
class LMOutput:
    """Result of one segment. ``nll``/``loss`` need targets; ``logits`` (log-probabilities) is on request."""

    mems: list[Tensor] = field(default_factory=list)
    nll: Tensor | None = None  # [B, T] per-token negative log-likelihood (nats)
    loss: Tensor | None = None  # mean of nll
    logits: Tensor | None = None  # [B, T, n_token] next-token log-probabilities
    hidden: Tensor | None = None  # [B, Q, D] final hidden states (after the output dropout), detached
    mem_kv: list[Tensor] | None = None  # inference cache: per layer, keys/values [B, M, 2*H*E] of ``mems``


class TransformerXLLM(nn.Module):
    """Transformer-XL language model with segment-level recurrence and relative positions."""

    def __init__(self, config: TXLConfig) -> None:
        super().__init__()
        config.validate()
        self.config = cfg = config
        self.built_config = config  # the lengths the parameters were sized with (attn_type 1/3)
        self.word_emb = AdaptiveEmbedding(cfg.n_token, cfg.d_embed, cfg.d_model, cfg.cutoffs, cfg.div_val,
                                          sparse=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.pos_enc = build_positional(cfg)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.n_head, cfg.d_model, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.dropatt,
                         cfg.pre_lnorm, pos_proj=self.pos_enc.needs_r_net)
            for _ in range(cfg.n_layer)
        )
        if cfg.sample_softmax > 0:
            self.out_layer = nn.Linear(cfg.d_model, cfg.n_token)
            self.sampler = LogUniformSampler(cfg.n_token, cfg.sample_softmax)
        else:
            self.crit = ProjectedAdaptiveLogSoftmax(cfg.n_token, cfg.d_embed, cfg.d_model, cfg.cutoffs,
                                                    cfg.div_val)
        self.reset_parameters()
        self.tie_weights()

    # ------------------------------------------------------------------ parameters
    def tie_weights(self) -> None:
        """Share output and input embeddings/projections as ``tie_weight``/``tie_projs`` ask (official rules)."""
        cfg = self.config
        if cfg.sample_softmax > 0:
            if cfg.tie_weight:
                self.out_layer.weight = self.word_emb.emb_layers[0].weight
            return
        if cfg.tie_weight:
            for out, emb in zip(self.crit.out_layers, self.word_emb.emb_layers):
                out.weight = emb.weight
        for i, tie in enumerate(cfg.tie_projs):
            if tie and cfg.div_val == 1 and cfg.d_model != cfg.d_embed:
                self.crit.out_projs[i] = self.word_emb.emb_projs[0]
            elif tie and cfg.div_val != 1:
                self.crit.out_projs[i] = self.word_emb.emb_projs[i]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The official ``weights_init``: N(0, init_std) (or U(+-init_range)) weights, zero biases,
        N(0, proj_init_std) projections, LayerNorm weights N(1, init_std)."""
        cfg = self.config

        def init_weight(w: Tensor) -> None:
            if cfg.init == "uniform":
                nn.init.uniform_(w, -cfg.init_range, cfg.init_range)
            else:
                nn.init.normal_(w, 0.0, cfg.init_std)

        for module in self.modules():
            if isinstance(module, nn.Linear):
                init_weight(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                init_weight(module.weight)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, cfg.init_std)
                nn.init.zeros_(module.bias)
        for proj in [*self.word_emb.emb_projs, *(self.crit.out_projs if hasattr(self, "crit") else [])]:
            nn.init.normal_(proj, 0.0, cfg.proj_init_std)
        if hasattr(self, "crit") and self.crit.n_clusters:
            init_weight(self.crit.cluster_weight)
            nn.init.zeros_(self.crit.cluster_bias)
        for name in ("r_emb", "r_w_bias", "r_r_bias"):
            if hasattr(self.pos_enc, name):
                init_weight(getattr(self.pos_enc, name))
        if hasattr(self.pos_enc, "r_bias"):
            nn.init.zeros_(self.pos_enc.r_bias)

    def reset_length(self, *, tgt_len: int | None = None, ext_len: int | None = None,
                     mem_len: int | None = None, clamp_len: int | None = None,
                     same_length: bool | None = None) -> None:
        """Change the evaluation-time lengths (as the official ``eval.py`` does), validated."""
        changes = {k: v for k, v in dict(tgt_len=tgt_len, ext_len=ext_len, mem_len=mem_len,
                                        clamp_len=clamp_len, same_length=same_length).items() if v is not None}
        new = dataclasses.replace(self.config, **changes)
        self.config = new

    def recompute(self, enabled: bool = True) -> None:
        """Trade compute for memory in training (``torch.utils.checkpoint``): every layer recomputes its
        attention scores, position term and probabilities in backward instead of keeping the
        ``[B, H, Q, K]`` probabilities. Same values and gradients (tested); no effect without a gradient.
        (Recomputing the output softmax too was measured and dropped: its backward runs first, while
        every other activation is still alive, so it does not lower the peak.)"""
        for layer in self.layers:
            layer.dec_attn.recompute = enabled

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied ones counted once)."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ memory
    def init_mems(self, batch_size: int) -> list[Tensor]:
        """Empty memories: ``n_layer + 1`` tensors ``[batch_size, 0, d_model]`` (``[]`` when mem_len is 0)."""
        if self.config.mem_len == 0:
            return []
        p = next(self.parameters())
        return [p.new_empty(batch_size, 0, self.config.d_model) for _ in range(self.config.n_layer + 1)]

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, targets: Tensor | None = None, mems: list[Tensor] | None = None,
                *, return_logits: bool = False, mem_kv: list[Tensor] | None = None) -> LMOutput:
        """Run one segment.

        Args:
            input_ids: ``[B, Q]`` token ids (``Q = ext_len + tgt_len`` with extended context).
            targets: ``[B, T]`` with ``T <= Q``: the token to predict at each of the last ``T`` positions.
            mems: memories from the previous segment (``n_layer + 1`` tensors ``[B, M, D]``), or None/[]
                to start fresh. They are not modified.
            return_logits: also return the next-token log-probabilities of the last ``T`` positions
                (all ``Q`` positions without targets).
            mem_kv: inference cache of the memories' attention keys/values: ``[]`` to start one, then the
                previous :attr:`LMOutput.mem_kv` together with its :attr:`LMOutput.mems`. Every memory
                position is then projected by ``W_k, W_v`` once, when it is a segment token, instead of
                once per segment it stays in memory (the same values: the weights are frozen). Only under
                ``torch.no_grad()`` and for the relative encodings (attn_type 0/1, whose memories carry no
                position); otherwise ``LMOutput.mem_kv`` is None and the memory is projected as usual.
        """
        cfg = self.config
        if input_ids.dim() != 2:
            raise ConfigError(f"input_ids must be [batch, time], got shape {tuple(input_ids.shape)}")
        bsz, qlen = input_ids.shape
        if targets is not None and (targets.dim() != 2 or targets.size(0) != bsz or targets.size(1) > qlen):
            raise ConfigError(f"targets must be [batch={bsz}, T<={qlen}], got shape {tuple(targets.shape)}")
        if cfg.mem_len > 0 and not mems:
            mems = self.init_mems(bsz)
        if mems and len(mems) != cfg.n_layer + 1:
            raise ConfigError(f"expected {cfg.n_layer + 1} memory tensors, got {len(mems)}")
        mlen = mems[0].size(1) if mems else 0
        if mem_kv is not None:
            if torch.is_grad_enabled():
                raise ConfigError("mem_kv is an inference cache: use it under torch.no_grad() (with a gradient "
                                  "the memory must be projected by the current weights)")
            if not self.pos_enc.memory_position_free:
                mem_kv = None
            elif mem_kv and (len(mem_kv) != cfg.n_layer or mem_kv[0].shape[:2] != (bsz, mlen)):
                raise ConfigError(f"mem_kv does not belong to these mems: expected {cfg.n_layer} tensors "
                                  f"[{bsz}, {mlen}, ...], got {len(mem_kv)} of {tuple(mem_kv[0].shape)}")

        word_emb = self.word_emb(input_ids)  # [B, Q, D]
        ctx = self.pos_enc.begin(qlen=qlen, mlen=mlen, clamp_len=cfg.clamp_len, dtype=word_emb.dtype,
                                 device=word_emb.device)
        mask_bias = cached_mask_bias(qlen=qlen, mlen=mlen, mem_len=cfg.mem_len, same_length=cfg.same_length,
                                     device=input_ids.device, dtype=word_emb.dtype)  # [Q, K], 0 / -inf

        core = self.drop(self.pos_enc.embed(word_emb, ctx))  # [B, Q, D]
        hids: list[Tensor] = []
        mems_in: list[Tensor] = []
        kvs: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            mem_i = mems[i] if mems else None
            core, mem_i = self.pos_enc.layer_inputs(i, core, mem_i, ctx)
            hids.append(core)
            if mem_i is not None:
                mems_in.append(mem_i)
            core, kv = layer(core, mem_i, layer=i, pos=self.pos_enc, ctx=ctx, mask_bias=mask_bias,
                             mem_kv=mem_kv[i] if mem_kv else None)
            kvs.append(kv)
        hids.append(core)
        core = self.drop(core)

        new_mems: list[Tensor] = []
        new_kv: list[Tensor] | None = None if mem_kv is None else []
        if mems:
            mems_in.append(mems[cfg.n_layer])
            new_mems = update_mems(hids, mems_in, mlen=mlen, qlen=qlen, mem_len=cfg.mem_len,
                                   ext_len=cfg.ext_len)
            if new_kv is not None:  # the same positions as the memories (keys/values of [memory; segment])
                beg, end = kept_range(mlen=mlen, qlen=qlen, mem_len=cfg.mem_len, ext_len=cfg.ext_len)
                new_kv = [kv[:, beg:end] for kv in kvs]

        out = LMOutput(mems=new_mems, hidden=core.detach(), mem_kv=new_kv)
        tlen = targets.size(1) if targets is not None else qlen
        pred = core[:, qlen - tlen:]  # [B, T, D]
        if targets is not None:
            out.nll = self._nll(pred.reshape(-1, pred.size(-1)), targets.reshape(-1)).view(bsz, tlen)
            out.loss = out.nll.mean()
        if return_logits:
            out.logits = self.log_prob(pred)
        return out

    def _nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        if self.config.sample_softmax > 0:
            if self.training:  # sampled softmax (official sample_logits), true class in column 0
                neg = self.sampler.sample().to(hidden.device)
                logit = sampled_logits(self.out_layer.weight, self.out_layer.bias, target, hidden, neg,
                                       self.sampler.log_q)
                return -log_softmax32(logit)[:, 0]
            logprob = log_softmax32(self.out_layer(hidden))
            return -logprob.gather(1, target[:, None]).squeeze(1)
        return self.crit.nll(hidden, target)

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Next-token log-probabilities ``[..., n_token]`` from final hidden states ``[..., D]``."""
        flat = hidden.reshape(-1, hidden.size(-1))
        if self.config.sample_softmax > 0:
            logprob = log_softmax32(self.out_layer(flat))
        else:
            logprob = self.crit.log_prob(flat)
        return logprob.view(*hidden.shape[:-1], -1)

    def generate(self, input_ids: Tensor, **kwargs):
        """Incremental decoding with the memory as cache; see :func:`txl.generate.generate` for the options."""
        from txl.generate import generate

        return generate(self, input_ids, **kwargs)

    # ------------------------------------------------------------------ weights on disk
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (atomically, no pickle).

        The config written is the one the model was built with; lengths changed by :meth:`reset_length`
        are evaluation settings and are not saved.
        """
        return save_weights(self, self.built_config, directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, map_location: str | torch.device = "cpu") -> TransformerXLLM:
        """Load a model written by :meth:`save_pretrained` (config validated, shapes checked)."""
        config, state = load_weights(directory, map_location=map_location)
        model = cls(TXLConfig.from_dict(config))
        model.load_state_dict_strict(state)
        return model.to(map_location)

    def load_state_dict_strict(self, state: dict[str, Tensor]) -> None:
        """Load our own state dict, with one clear error listing missing/unexpected/mis-shaped keys."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        bad = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
        if missing or unexpected or bad:
            parts = []
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", bad)):
                if keys:
                    parts.append(f"{label}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}")
            raise CheckpointError("weights do not fit the config (" + "; ".join(parts) + ")")
        self.load_state_dict(state, strict=True)
