"""The Transformer-XL language model, batch-first (paper Sec. 3; official ``MemTransformerLM``).

``TransformerXLLM(config)(input_ids, targets=None, mems=None)`` runs one segment:

1. word embeddings (adaptive input, scaled by ``sqrt(d_model)``) plus what the position strategy adds;
2. ``n_layer`` decoder layers, layer ``n`` attending over ``[SG(m^{n-1}); h^{n-1}]`` (paper Sec. 3.2);
3. the (adaptive or sampled) softmax over the last ``targets.size(1)`` positions.

Memories are a list of ``n_layer + 1`` tensors ``[B, M, D]``: the input of every layer and the final
output (the last is kept, unused, for parity with the official code). ``targets[:, t]`` is the token to
predict at position ``t`` (aligned, no shift inside the model). The lengths that may differ from training
(``mem_len``, ``ext_len``, ``clamp_len``, ``same_length``) are the ``lengths=`` argument
(:class:`transformer_xl.model.config.Lengths`, default: the config's); the caller's inference cache is ``cache=``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from transformer_xl import hooks
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.model.adaptive import (
    AdaptiveEmbedding,
    LogUniformSampler,
    ProjectedAdaptiveLogSoftmax,
    log_softmax32,
    sampled_logits,
)
from transformer_xl.model.attention import DecoderLayer
from transformer_xl.model.cache import InferenceCache
from transformer_xl.model.config import Lengths, TXLConfig
from transformer_xl.model.dispatch import mask_bias
from transformer_xl.model.fastpath import CompactDropout
from transformer_xl.model.int8 import check_scheme, quantize_linears
from transformer_xl.model.memory import kept_range, padded_mask_bias, update_mems, update_padded_mems
from transformer_xl.model.positional import build_positional
from transformer_xl.model.pretrained import SupportsToJson, check_weights_header, checked_vocab_json, mismatch
from transformer_xl.model.segment import Segment
from transformer_xl.store.layout import WEIGHTS, load_weights, read_model_config, save_model_dir
from transformer_xl.store.tensors import read_header

if TYPE_CHECKING:  # the types of generate/stream only: the model layer never imports inference (hooks.py)
    from transformer_xl.inference.generate import GenerationOutput, GenerationStep


@dataclass
class LMOutput:
    """Result of one segment. ``nll``/``loss`` need targets; ``log_probs`` is on request."""

    mems: list[Tensor] = field(default_factory=list)
    nll: Tensor | None = None  # [B, T] per-token negative log-likelihood (nats)
    loss: Tensor | None = None  # mean of nll
    log_probs: Tensor | None = None  # [B, T, n_token] next-token log-probabilities
    hidden: Tensor | None = None  # [B, Q, D] final hidden states (after the output dropout), detached
    mem_mask: Tensor | None = None  # [B, M'] which memory positions are real (a forward given ``key_mask`` only)


class TransformerXLLM(nn.Module):
    """Transformer-XL language model with segment-level recurrence and relative positions."""

    def __init__(self, config: TXLConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.word_emb = AdaptiveEmbedding(cfg.n_token, cfg.d_embed, cfg.d_model, cfg.cutoffs, cfg.div_val,
                                          sparse=False)
        self.drop = CompactDropout(cfg.dropout)  # nn.Dropout's scaling, faster draws on the CPU (fastpath)
        self.pos_enc = build_positional(cfg)
        self.layers = nn.ModuleList(
            DecoderLayer(i, cfg.n_head, cfg.d_model, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.dropatt,
                         cfg.pre_lnorm, pos_proj=self.pos_enc.needs_r_net, eps=cfg.layer_norm_epsilon)
            for i in range(cfg.n_layer)
        )
        if cfg.sample_softmax > 0:
            self.out_layer = nn.Linear(cfg.d_model, cfg.n_token)
            self.sampler = LogUniformSampler(cfg.n_token, cfg.sample_softmax)
        else:
            self.crit = ProjectedAdaptiveLogSoftmax(cfg.n_token, cfg.d_embed, cfg.d_model, cfg.cutoffs,
                                                    cfg.div_val)
        self.reset_parameters()
        self.tie_weights()
        self.quantized: str | None = None  # "int8" after quantize()

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

    def recompute(self, enabled: bool = True) -> None:
        """Trade compute for memory in training (``torch.utils.checkpoint``): every layer recomputes its
        attention scores, position term and probabilities in backward instead of keeping the
        ``[B, H, Q, K]`` probabilities. Same values and gradients (tested); no effect without a gradient.
        (Recomputing the output softmax too was measured and dropped: its backward runs first, while
        every other activation is still alive, so it does not lower the peak.)"""
        for layer in self.layers:
            layer.dec_attn.recompute = enabled

    def reference(self, enabled: bool = True) -> None:
        """Run the paper's formulas as written (``rel_shift`` of Appendix B, the ``[B, H, Q, K]`` scores whole, an
        explicit softmax) instead of the fast paths that :func:`transformer_xl.model.dispatch.choose` picks: the
        same values up to float rounding, slower; for checking a fast path or a new variant against the paper."""
        for layer in self.layers:
            layer.dec_attn.plain = enabled

    def flex_attention(self, enabled: bool = True) -> None:
        """Let training on CUDA run the attention by FlexAttention when ``dropatt`` is 0
        (:mod:`transformer_xl.model.flex`: the position term read unshifted by a ``score_mod``, one generated kernel
        that forms neither the shifted ``P`` nor the ``[B, H, Q, K]`` scores and probabilities); off by default, since
        its gradients cannot be checked on a CPU (tests marked ``gpu`` check them). Evaluation, CPU training and
        ``dropatt > 0`` keep their paths (:func:`transformer_xl.model.dispatch.choose`)."""
        for layer in self.layers:
            layer.dec_attn.flex = enabled

    def quantize(self, scheme: str = "int8") -> TransformerXLLM:
        """Quantize for CPU inference, in place, and return the model (in eval mode): the linear layers of every
        block (``qkv_net``, ``o_net``, the feed-forward ``CoreNet``) and the output softmax get int8 weights
        (:class:`~transformer_xl.model.int8.Int8Linear`: int8 rows with bf16 scales, the captured step's kernel;
        the input is not quantized). ``W_kR`` (``r_net``),
        the biases ``u``, ``v``, LayerNorms and the input embedding stay float. A quantized model generates and
        evaluates; it does not train or save (keep the float model's directory). Measured cost and speed:
        ``docs/performance.md``."""
        check_scheme(scheme, next(self.parameters()).device)
        if self.quantized is not None:
            raise ConfigError(f"the model is already quantized ({self.quantized})")
        names = [f"layers.{i}.{name}" for i in range(self.config.n_layer)
                 for name in ("dec_attn.qkv_net", "dec_attn.o_net", "pos_ff.CoreNet.0", "pos_ff.CoreNet.3")]
        if self.config.sample_softmax > 0:
            names.append("out_layer")
        self.eval()
        quantize_linears(self, names)
        if hasattr(self, "crit"):
            self.crit.quantize()
        self.quantized = scheme
        return self

    def train(self, mode: bool = True) -> TransformerXLLM:
        if mode and getattr(self, "quantized", None) is not None:
            raise ConfigError(f"a {self.quantized}-quantized model is for inference only: train the float model")
        return super().train(mode)

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied ones counted once)."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ memory
    def init_mems(self, batch_size: int) -> list[Tensor]:
        """The memories a stream starts from: ``n_layer + 1`` tensors ``[batch_size, 0, d_model]`` (``[]`` when
        mem_len is 0), or with ``tf_memory`` the TF code's ``mem_len`` zero states (what ``forward`` starts from when
        given no memory)."""
        if self.config.mem_len == 0:
            return []
        return self._start_mems(batch_size, self.config.mem_len if self.config.tf_memory else 0)

    def _start_mems(self, batch_size: int, length: int) -> list[Tensor]:
        p = next(self.parameters())
        return [p.new_zeros(batch_size, length, self.config.d_model) for _ in range(self.config.n_layer + 1)]

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, targets: Tensor | None = None, mems: list[Tensor] | None = None, *,
                lengths: Lengths | None = None, cache: InferenceCache | None = None,
                return_log_probs: bool = False, key_mask: Tensor | None = None) -> LMOutput:
        """Run one segment (paper Sec. 3.2-3.3).

        Args:
            input_ids: ``[B, Q]`` token ids (``Q = ext_len + tgt_len`` with extended context).
            targets: ``[B, T]`` with ``T <= Q``: the token to predict at each of the last ``T`` positions.
            mems: memories from the previous segment (``n_layer + 1`` tensors ``[B, M, D]``), or None/[]
                to start fresh. They are not modified.
            lengths: ``mem_len``, ``ext_len``, ``clamp_len``, ``same_length`` for this forward (default: the
                config's; e.g. ``model.config.lengths(mem_len=1600)`` for a longer evaluation memory).
            cache: an :class:`transformer_xl.model.cache.InferenceCache` owned by the caller, under ``torch.no_grad()``:
                the memory's keys/values and ``W_kR R`` are reused from the previous forward (same values).
            return_log_probs: also return the next-token log-probabilities of the last ``T`` positions
                (all ``Q`` positions without targets).
            key_mask: ``[B, M + Q]`` bool, False at padding (of the memory, then of this segment), for batches of
                texts of different lengths: padding keys are masked
                (:func:`~transformer_xl.model.memory.padded_mask_bias`) and each row's memory keeps its real
                positions only, right-aligned, with ``LMOutput.mem_mask`` saying which positions are real (the next
                call's memory part of ``key_mask``). Relative encodings only (a padded row's absolute positions
                would differ from its own), no ``ext_len``, no inference cache.
        """
        lengths = self.config.lengths() if lengths is None else lengths
        bsz, qlen = self._check_inputs(input_ids, targets, mems)
        if not mems and lengths.mem_len > 0:  # a fresh stream: empty, or the TF code's mem_len zero states
            mems = self._start_mems(bsz, start := lengths.mem_len if lengths.tf_memory else 0)
            if key_mask is not None and start and key_mask.size(1) == qlen:  # zero states are attended to: real keys
                key_mask = torch.cat([key_mask.new_ones(bsz, start), key_mask], dim=1)
        mems = list(mems) if mems else []
        mlen = mems[0].size(1) if mems else 0
        if not self.pos_enc.memory_position_free:
            cache = None  # absolute encodings: a memory position's keys depend on where it sits
        if key_mask is not None:
            self._check_key_mask(key_mask, bsz, mlen + qlen, lengths)
            cache = None
        if cache is not None:
            cache.begin(self, mems, qlen=qlen, mem_len=lengths.mem_len)
        word_emb = self.word_emb(input_ids)  # [B, Q, D], sqrt(D) E[w]
        dtype, device = word_emb.dtype, word_emb.device
        bias = mask_bias(qlen=qlen, mlen=mlen, mem_len=lengths.window, same_length=lengths.same_length,
                         device=device, dtype=dtype)  # [Q, K]
        if key_mask is not None:
            key_mask = key_mask.to(device)
            bias = padded_mask_bias(bias, key_mask, mlen=mlen)  # [B, 1, Q, K]
        seg = Segment(qlen=qlen, mlen=mlen, lengths=lengths, pos=self.pos_enc, mask_bias=bias,
                      make_table=lambda: self.pos_enc.table(qlen + mlen, lengths.clamp_len, dtype, device),
                      cache=cache)
        if cache is None:  # made now: in training R's dropout draws come before those of h, as always
            _ = seg.table

        h = self.pos_enc.embed(word_emb, seg)  # h^0: [B, Q, D] (dropout in training)
        if self.training:
            h = self.drop(h)
        hids: list[Tensor] = []  # h^{n-1}, the input of every layer (what the next memory keeps)
        mems_in: list[Tensor] = []  # m^{n-1} as the layer read it (absolute encodings add positions)
        for i, layer in enumerate(self.layers):
            h, mem = self.pos_enc.layer_inputs(i, h, mems[i] if mems else None, seg)
            hids.append(h)
            if mem is not None:
                mems_in.append(mem)
            h = layer(h, mem, seg)  # h^n: attention over [SG(m^{n-1}); h^{n-1}], feed-forward
        hids.append(h)
        if self.training:
            h = self.drop(h)

        new_mems: list[Tensor] = []
        new_mask = None
        if mems and key_mask is not None:
            new_mems, new_mask = update_padded_mems(hids, [*mems_in, mems[-1]], key_mask, mem_len=lengths.mem_len)
        elif mems and cache is not None:  # the same positions, written once into the cache's buffers (views)
            beg, end = kept_range(mlen=mlen, qlen=qlen, mem_len=lengths.mem_len, ext_len=lengths.ext_len)
            new_mems = cache.commit(hids, mems, beg=beg, end=end)
        elif mems:  # m^n_{tau+1} = SG(h^n_tau), the last mem_len positions (paper Sec. 3.2)
            new_mems = update_mems(hids, [*mems_in, mems[-1]], mlen=mlen, qlen=qlen, mem_len=lengths.mem_len,
                                   ext_len=lengths.ext_len)

        out = LMOutput(mems=new_mems, hidden=h.detach(), mem_mask=new_mask)
        tlen = targets.size(1) if targets is not None else qlen
        pred = h[:, qlen - tlen:]  # [B, T, D]
        if targets is not None:
            out.nll = self._nll(pred.reshape(-1, pred.size(-1)), targets.reshape(-1)).view(bsz, tlen)
            out.loss = out.nll.mean()
        if return_log_probs:
            out.log_probs = self.log_prob(pred)
        return out

    def _check_inputs(self, input_ids: Tensor, targets: Tensor | None, mems: list[Tensor] | None) -> tuple[int, int]:
        """``(B, Q)``, or a one-line :class:`ConfigError` for inputs of the wrong shape."""
        if input_ids.dim() != 2:
            raise ConfigError(f"input_ids must be [batch, time], got shape {tuple(input_ids.shape)}")
        bsz, qlen = input_ids.shape
        if targets is not None and (targets.dim() != 2 or targets.size(0) != bsz or targets.size(1) > qlen):
            raise ConfigError(f"targets must be [batch={bsz}, T<={qlen}], got shape {tuple(targets.shape)}")
        if mems and len(mems) != self.config.n_layer + 1:
            raise ConfigError(f"expected {self.config.n_layer + 1} memory tensors, got {len(mems)}")
        return bsz, qlen

    def _check_key_mask(self, key_mask: Tensor, bsz: int, klen: int, lengths: Lengths) -> None:
        """A one-line :class:`ConfigError` for a ``key_mask`` this model cannot honour or of the wrong shape."""
        if not self.pos_enc.memory_position_free:
            raise ConfigError(f"padding needs relative positions: attn_type {self.config.attn_type} gives a padded "
                              "row other absolute positions than it has alone")
        if lengths.ext_len > 0:
            raise ConfigError("padding (key_mask) is not supported with ext_len > 0")
        if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (bsz, klen):
            raise ConfigError(f"key_mask must be bool [batch={bsz}, memory + segment={klen}], got "
                              f"{key_mask.dtype} {tuple(key_mask.shape)}")

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

    # ------------------------------------------------------------------ weights on disk
    def save_pretrained(self, directory: str | Path, vocab: str | SupportsToJson | None = None) -> Path:
        """Write ``config.json``, ``model.safetensors`` and their ``MANIFEST.json`` (SHA-256) into ``directory``
        (atomically, no pickle); returns ``directory``.

        ``vocab``, a :class:`transformer_xl.data.Vocab` (anything with ``to_json()``) or its JSON text, is written as
        ``vocab.json`` and listed in the manifest, so the directory alone is enough to generate text; a
        vocabulary of another size than ``config.n_token`` is refused (:class:`ConfigError`)."""
        if self.quantized is not None:
            raise ConfigError(f"a {self.quantized}-quantized model is not saved (its weights are packed for one "
                              "CPU kernel): save the float model, and quantize after loading")
        vocab_json = checked_vocab_json(vocab, self.config.n_token)
        return save_model_dir(directory, self.state_dict(), self.config.to_json(), vocab_json=vocab_json)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, revision: str | None = None,
                        map_location: str | torch.device = "cpu", verify: bool = True) -> TransformerXLLM:
        """Load a model written by :meth:`save_pretrained`, **in eval mode** (dropout off, as Hugging Face's
        ``from_pretrained``; ``model.train()`` to train it), or a Hub id ``"ORG/NAME[@REVISION]"`` (or
        ``revision=``) when no local path of that name exists and ``ORG`` is no local directory
        (:mod:`transformer_xl.interop.hub`). Refused in one line
        (:class:`CheckpointError`): with ``verify`` (default), a file that does not match the directory's
        ``MANIFEST.json`` (a directory without one, from an older txl or made by hand, loads unchecked); a config
        that does not describe the weights file, found from the file's header before the model is built
        (:func:`check_weights_header`: no huge allocation for a wrong or hostile config); weights holding NaN or
        inf; an unknown or unreachable Hub id."""
        hub_dir = hooks.layers().pretrained_dir(str(directory), revision)
        if hub_dir is None and revision is not None:
            raise ConfigError(f"revision={revision!r} applies to Hub ids (ORG/NAME); {directory} is a local path")
        directory = directory if hub_dir is None else hub_dir
        path = Path(directory) / WEIGHTS
        config = TXLConfig.from_dict(read_model_config(directory, verify=verify))
        check_weights_header(config, read_header(path), path, build=cls)
        model = cls(config)
        model.load_state_dict_strict(load_weights(directory, map_location))
        return model.to(map_location).eval()

    def generate(self, input_ids: Tensor | Sequence[int], *, max_new_tokens: int = 100,
                 **kwargs: Any) -> GenerationOutput:
        """Hugging Face's ``model.generate(input_ids, max_new_tokens=..., do_sample=..., top_p=...)``: the
        ``GenerationOutput`` of :func:`transformer_xl.inference.generate.generate` (every keyword as there)."""
        return hooks.layers().generate(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)

    def stream(self, input_ids: Tensor | Sequence[int], *, max_new_tokens: int = 100,
               **kwargs: Any) -> Iterator[GenerationStep]:
        """One ``GenerationStep`` per new token, as :func:`transformer_xl.inference.generate.stream`."""
        return hooks.layers().stream(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)

    def load_state_dict_strict(self, state: dict[str, Tensor]) -> None:
        """Load our own state dict, with one clear error listing missing/unexpected/mis-shaped keys."""
        problem = mismatch({k: v.shape for k, v in self.state_dict().items()}, {k: v.shape for k, v in state.items()})
        if problem:
            raise CheckpointError(f"weights do not fit the config ({problem})")
        self.load_state_dict(state, strict=True)
