"""Model configuration: :class:`TXLConfig`, with the official ``MemTransformerLM`` constructor names.

Field names are those of ``MemTransformerLM.__init__`` in the official PyTorch code
(kimiyoung/transformer-xl, ``pytorch/mem_transformer.py``) plus:

* ``untie_r``: separate global biases ``u`` (``r_w_bias``) and ``v`` (``r_r_bias``) per layer, an option
  of the official TF code and of Hugging Face's port (the released WT103/lm1b checkpoints need it);
* ``layer_norm_epsilon``: added to the variance in every LayerNorm: 1e-5 in the PyTorch code (``nn.LayerNorm``),
  1e-12 in the TF code (``tf.contrib.layers.layer_norm``), which trained the released checkpoints;
* ``tf_memory``: the TF code's memory at evaluation (:class:`Lengths`);
* ``init``, ``init_range``, ``init_std``, ``proj_init_std``: the official ``train.py`` initialization
  options, which belong with the model because they decide its initial weights.

A config is frozen: it says what a model was built with. The lengths a forward may use differently
from training (the paper evaluates with a much longer memory than it trains with) are a separate small
frozen object, :class:`Lengths`, passed to ``TransformerXLLM.forward(lengths=...)``;
``config.lengths(mem_len=1600)`` gives the config's lengths with some of them changed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, check_int, did_you_mean
from transformer_xl.safejson import parse_object, read_object, short_repr
from transformer_xl.store.layout import MODEL_TYPE, model_fields

#: ``attn_type`` values of the official code (paper Table 6 ablations).
ATTN_TYPES = {
    0: "relative, sinusoid R with global biases u, v and W_kR (Transformer-XL, paper Sec. 3.3)",
    1: "relative, learnable per-layer embeddings (Shaw et al., 2018)",
    2: "absolute sinusoid added to the input (Vaswani et al., 2017)",
    3: "absolute learnable embeddings added at every layer (Al-Rfou et al., 2018)",
}


@dataclass(frozen=True)
class Lengths:
    """The lengths of a forward that may differ from training (paper Sec. 3.2: evaluation can use a much
    longer memory than training). Frozen; ``TXLConfig.lengths(**changes)`` builds one.

    * ``mem_len``: positions kept as the next memory (0: no recurrence);
    * ``ext_len``: the last ``ext_len`` positions of a segment are left out of the next memory (the next
      segment re-reads them as extended context);
    * ``clamp_len``: relative distances are clamped at ``clamp_len`` (-1 or 0: no clamping, as the official
      ``clamp_len <= 0``; values below -1 are refused as typos);
    * ``same_length``: every query attends to the same number (``mem_len``) of keys;
    * ``tf_memory``: the official TensorFlow code's memory (``tf/train_gpu.py``, ``tf/model.py``), with which the
      paper's released checkpoints were evaluated: a stream's memory starts as ``mem_len`` zero vectors, which are
      attended to (the PyTorch code starts from an empty memory), and under ``same_length`` a query sees itself and
      the ``mem_len`` keys before it (TF's ``_create_mask``; the PyTorch code's window is ``mem_len`` keys, itself
      included): :attr:`window`.
    """

    mem_len: int
    ext_len: int = 0
    clamp_len: int = -1
    same_length: bool = False
    tf_memory: bool = False

    def __post_init__(self) -> None:
        check_int("mem_len", self.mem_len, 0)
        check_int("ext_len", self.ext_len, 0)
        if not isinstance(self.clamp_len, int) or isinstance(self.clamp_len, bool) or self.clamp_len < -1:
            raise ConfigError("clamp_len must be an integer >= -1 (-1 or 0: no clamping), got "
                              f"{short_repr(self.clamp_len)}")
        for name in ("same_length", "tf_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {short_repr(getattr(self, name))}")
        if self.same_length and self.mem_len == 0:
            raise ConfigError("same_length=True needs mem_len > 0 (with mem_len 0 every query of the official "
                              "same-length mask would see no key)")

    def replace(self, **changes: Any) -> Lengths:
        """These lengths with ``changes`` applied; ``None`` values are ignored (validated)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def window(self) -> int:
        """The keys a query sees under ``same_length``: ``mem_len`` (itself included), or ``mem_len + 1`` with
        ``tf_memory`` (itself and the ``mem_len`` before it)."""
        return self.mem_len + 1 if self.tf_memory else self.mem_len


@dataclass(frozen=True)
class TXLConfig:
    """Hyper-parameters of a Transformer-XL language model (official ``MemTransformerLM`` names); frozen."""

    n_token: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_head: int = 32
    d_inner: int = 512
    dropout: float = 0.0
    dropatt: float = 0.0
    tie_weight: bool = True
    d_embed: int | None = None
    div_val: int = 1
    tie_projs: tuple[bool, ...] = (False,)
    pre_lnorm: bool = False
    tgt_len: int = 128
    ext_len: int = 0
    mem_len: int = 128
    cutoffs: tuple[int, ...] = ()
    same_length: bool = False
    attn_type: int = 0
    clamp_len: int = -1
    sample_softmax: int = -1
    untie_r: bool = False
    layer_norm_epsilon: float = 1e-5
    tf_memory: bool = False
    init: str = "normal"
    init_range: float = 0.1
    init_std: float = 0.02
    proj_init_std: float = 0.01

    def __post_init__(self) -> None:
        if self.d_embed is None:
            object.__setattr__(self, "d_embed", self.d_model)
        # tuples: frozen all the way
        object.__setattr__(self, "cutoffs", _check_list("cutoffs", self.cutoffs, int))
        object.__setattr__(self, "tie_projs", _check_list("tie_projs", self.tie_projs, bool))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise :class:`ConfigError` (one line, naming the field) for an impossible configuration."""
        for name in ("n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner", "d_embed", "tgt_len",
                     "div_val"):
            check_int(name, getattr(self, name), 1)
        self.lengths()  # mem_len, ext_len, clamp_len, same_length
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
            raise ConfigError(f"layer_norm_epsilon must be a number in (0, 1), got {short_repr(eps)}")
        for name in ("tie_weight", "pre_lnorm", "untie_r"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {short_repr(getattr(self, name))}")
        for name, low, high in (("dropout", 0.0, 1.0), ("dropatt", 0.0, 1.0), ("init_range", 0.0, math.inf),
                                ("init_std", 0.0, math.inf), ("proj_init_std", 0.0, math.inf)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
                where = "in [0, 1)" if high == 1.0 else "a finite number >= 0"
                raise ConfigError(f"{name} must be {where}, got {short_repr(value)}")
        check_int("sample_softmax", self.sample_softmax, -1)  # -1 or 0: the full softmax
        if isinstance(self.attn_type, bool) or self.attn_type not in ATTN_TYPES:
            raise ConfigError(f"attn_type must be one of {sorted(ATTN_TYPES)}, got {short_repr(self.attn_type)}")
        if self.attn_type in (0, 2) and self.d_model % 2:
            raise ConfigError(f"attn_type {self.attn_type} uses a sinusoid of size d_model, which must be even "
                              f"(got d_model={self.d_model})")
        if self.attn_type == 3 and self.n_head * self.d_head != self.d_model:
            raise ConfigError("attn_type 3 adds per-layer embeddings of size n_head*d_head to the hidden "
                              f"states, so n_head*d_head ({self.n_head * self.d_head}) must equal d_model "
                              f"({self.d_model})")
        if self.attn_type in (1, 3) and self.max_klen < 1:
            raise ConfigError("attn_type 1 and 3 learn tgt_len+ext_len+mem_len position embeddings, "
                              "which must be >= 1")
        if self.untie_r and self.attn_type != 0:
            raise ConfigError("untie_r applies to attn_type 0 only (attn_type 1 always has per-layer biases)")
        cut = self.cutoffs
        if any(b <= a for a, b in pairwise(cut)):
            raise ConfigError(f"cutoffs must be strictly increasing, got {cut}")
        if cut and (cut[0] <= 0 or cut[-1] >= self.n_token):
            raise ConfigError(f"cutoffs must lie strictly between 0 and n_token={self.n_token}, got {cut}")
        if len(self.tie_projs) > len(cut) + 1:
            raise ConfigError(f"tie_projs has {len(self.tie_projs)} entries but there are only "
                              f"{len(cut) + 1} clusters (cutoffs {cut})")
        if self.div_val > 1:
            smallest = self.d_embed // self.div_val ** len(cut)
            if smallest < 1:
                raise ConfigError(f"div_val={self.div_val} leaves the last cluster an embedding size of "
                                  f"{self.d_embed}//{self.div_val}**{len(cut)} = 0; lower div_val or raise d_embed")
        if self.sample_softmax > 0:
            if self.div_val != 1 or self.d_embed != self.d_model:
                raise ConfigError("sample_softmax > 0 uses one output matrix of size n_token x d_model: it needs "
                                  "div_val == 1 and d_embed == d_model")
            if self.sample_softmax >= self.n_token:
                raise ConfigError(f"sample_softmax ({self.sample_softmax}) must be smaller than n_token "
                                  f"({self.n_token})")
        if not isinstance(self.init, str) or self.init not in ("normal", "uniform"):
            raise ConfigError(f"init must be 'normal' or 'uniform', got {short_repr(self.init)}")

    # ------------------------------------------------------------------ derived
    def lengths(self, **changes: Any) -> Lengths:
        """The config's :class:`Lengths`, with ``changes`` applied (``None`` values ignored)."""
        return Lengths(mem_len=self.mem_len, ext_len=self.ext_len, clamp_len=self.clamp_len,
                       same_length=self.same_length, tf_memory=self.tf_memory).replace(**changes)

    @property
    def max_klen(self) -> int:
        """Number of learned positions for attn_type 1/3: ``tgt_len + ext_len + mem_len`` (official)."""
        return self.tgt_len + self.ext_len + self.mem_len

    @property
    def max_context(self) -> int | None:
        """The most keys one query can read, or None when unbounded: attn_type 3 (Al-Rfou et al.) learned
        ``max_klen`` absolute positions and reads nothing beyond them."""
        return self.max_klen if self.attn_type == 3 else None

    def cluster_shapes(self) -> list[tuple[int, int]]:
        """``(tokens, embedding size)`` of each embedding table: one ``(n_token, d_embed)`` table when
        ``div_val == 1``, else cluster ``i`` of the cutoffs with size ``d_embed // div_val**i``."""
        assert self.d_embed is not None
        if self.div_val == 1:
            return [(self.n_token, self.d_embed)]
        bounds = [0, *self.cutoffs, self.n_token]
        return [(hi - lo, self.d_embed // self.div_val**i) for i, (lo, hi) in enumerate(pairwise(bounds))]

    def parameter_count(self, *, tied_names: bool = False) -> int:
        """The number of parameters of a ``TransformerXLLM`` of this config, from the config alone (no tensor is
        built, so it is instant for any size): each tied parameter once, as ``num_parameters()`` counts, or with
        ``tied_names`` once per name, as ``state_dict()`` lists them.

        Embeddings ``sum_i V_i d_i`` (+ projections ``D d_i``), positions (attn_type 0: ``u, v``; 1: ``r_emb``,
        ``r_w_bias``, ``r_bias``; 3: ``r_emb``), per layer ``(4 + [attn_type 0]) H E D + 2 D I + I + 5 D``
        (``qkv``, ``r_net``, ``o_net``, the feed-forward and two LayerNorms), the softmax's output layers,
        projections and cluster head; tied ones (``tie_weight``, ``tie_projs``) are shared with the input's."""
        d, h, e, n_layer = self.d_model, self.n_head, self.d_head, self.n_layer
        d_embed = self.d_embed
        assert d_embed is not None
        tables = self.cluster_shapes()
        total = sum(v * di for v, di in tables)
        projected = self.div_val != 1 or d != d_embed
        if projected:
            total += sum(d * di for _, di in tables[: 1 if self.div_val == 1 else None])
        total += {0: 2 * (n_layer if self.untie_r else 1) * h * e,
                  1: n_layer * (self.max_klen * h * e + h * e + self.max_klen * h),
                  2: 0, 3: n_layer * self.max_klen * h * e}[self.attn_type]
        total += n_layer * ((5 if self.attn_type == 0 else 4) * h * e * d + 2 * d * self.d_inner + self.d_inner
                            + 5 * d)
        if self.sample_softmax > 0:
            return total + self.n_token + (self.n_token * d if tied_names or not self.tie_weight else 0)
        n_clusters = len(self.cutoffs)
        total += n_clusters * (d_embed + 1) + self.n_token  # cluster head, output biases
        if tied_names or not self.tie_weight:
            total += sum(v * di for v, di in tables)
        if projected:
            proj_sizes = [d * d_embed] * (n_clusters + 1) if self.div_val == 1 else [d * di for _, di in tables]
            tied = [i < len(self.tie_projs) and self.tie_projs[i] for i in range(len(proj_sizes))]
            total += sum(size for size, t in zip(proj_sizes, tied) if tied_names or not t)
        return total

    def replace(self, **changes: Any) -> TXLConfig:
        """A new (validated) config with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values (``cutoffs`` and ``tie_projs`` as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TXLConfig:
        """Build from a dict, rejecting unknown keys by name (with the closest known name), and a value that no
        field takes (an object, a list of lists, a string of more than :data:`MAX_NAME` characters) in a short
        line, before any field's check quotes it whole (a list only for :data:`LIST_FIELDS`). The keys that name the
        model for transformers' Auto classes (``model_type``, ``architectures``) are read past
        (:func:`transformer_xl.store.layout.model_fields`)."""
        data = model_fields(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in known]
        if unknown:
            key = unknown[0]
            hint = did_you_mean(key, known) if len(str(key)) <= MAX_NAME else ""
            raise ConfigError(f"unknown model config key {short_repr(key)}{hint}")
        for key, value in data.items():
            listed = key in LIST_FIELDS and isinstance(value, (list, tuple)) and all(map(_plain, value))
            if not (listed or _plain(value)):
                kind = "a list of numbers" if key in LIST_FIELDS else "a number, true/false, null or a name"
                raise ConfigError(f"model config key {key!r} must be {kind}, got {short_repr(value)}")
        if "n_token" not in data:
            raise ConfigError("model config lacks the required key 'n_token'")
        try:
            return cls(**data)
        except TypeError as exc:  # e.g. a list where an int belongs
            raise ConfigError(f"bad model config: {exc}") from exc

    def to_json(self) -> str:
        """The fields as JSON, with ``model_type`` (:data:`~transformer_xl.store.layout.MODEL_TYPE`): a model
        directory's ``config.json``, which transformers' Auto classes also read once :mod:`transformer_xl.hf` has
        registered the type."""
        return json.dumps({"model_type": MODEL_TYPE, **self.to_dict()}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> TXLConfig:
        """Read a config from a JSON file path or a JSON string."""
        text = str(path_or_text)
        if text.lstrip().startswith("{"):
            return cls.from_dict(parse_object(text, "config"))
        return cls.from_dict(read_object(Path(path_or_text), "config file"))


#: The fields whose value is a list (of integers, of true/false); the others are single values.
LIST_FIELDS = ("cutoffs", "tie_projs")
#: The longest string a model config's value may be (its names: ``init``'s ``normal``, ``uniform``).
MAX_NAME = 100


def _plain(value: Any) -> bool:
    """Whether ``value`` is a JSON scalar a config field could take: null, a bool, a number, a short string."""
    return value is None or isinstance(value, (bool, numbers.Number)) or (isinstance(value, str)
                                                                          and len(value) <= MAX_NAME)


def _check_list(name: str, value: Any, kind: type) -> tuple:
    """``value`` as a tuple of ``kind`` (integers, or true/false with 0/1 accepted), else a one-line
    :class:`ConfigError`; a string is not a list."""
    def fits(v: Any) -> bool:
        if kind is bool:
            return isinstance(v, bool) or (isinstance(v, numbers.Integral) and v in (0, 1))
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if not isinstance(value, (list, tuple)) or not all(fits(v) for v in value):
        what = "integers" if kind is int else "true/false values"
        raise ConfigError(f"{name} must be a list of {what}, got {short_repr(value)}")
    return tuple(kind(v) for v in value)
