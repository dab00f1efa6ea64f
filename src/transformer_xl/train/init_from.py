"""Fine-tuning: ``txl train --init-from MODEL`` starts a NEW run from a pretrained model's weights.

``MODEL`` is anything :func:`transformer_xl.store.layout.resolve_model_dir` accepts (a model directory, e.g. one
written by
``txl convert --from hf|official``, a checkpoint ``step_*`` directory or a run directory), loaded and verified as
:func:`transformer_xl.inference.loading.load_model` does (manifest SHA-256 sums, config against the weights' header, no
NaN/inf). The run gets a new optimizer and schedule from step 0; what it takes from the model:

* **the architecture**: the model's config, over which only :data:`SETTABLE` fields may be set (dropout and the
  lengths a forward may use differently). A model field that changes a shape or the function (``n_layer``,
  ``d_model``, ``cutoffs``, ``attn_type``, ...) and differs from the model's value is refused in one line naming
  it and the model's value; for attn_type 1 and 3, whose learned position tables have ``tgt_len + ext_len +
  mem_len`` rows, that sum may not change either. The run's config keeps the merged model fields in
  ``model_overrides``, so a resume needs the model's directory no more;
* **the vocabulary** (:func:`transformer_xl.store.layout.find_vocab` beside the model, or ``init_vocab``: a file or a
  dataset name such as ``wt103``, the vocabulary of that dataset's prepared cache): the dataset's
  text is encoded with it (:func:`transformer_xl.data.load_corpus` with ``vocab=``), the tokens it lacks become
  ``<unk>``
  and their count is printed; text of another level (characters for a word vocabulary) is refused.

The run's ``config.json`` records ``init_from`` (the model directory, its weights' SHA-256, the vocabulary file
and its SHA-256); ``init_from`` is fixed on ``--resume``, which restores the run's own
checkpoint (the model's weights are read only when a run starts, or starts again before its first checkpoint).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_xl.data import Vocab
from transformer_xl.errors import CheckpointError, ConfigError, DataError
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.store.files import read_json, sha256_file, write_json
from transformer_xl.store.layout import WEIGHTS, RunDir, find_vocab
from transformer_xl.train.config import TrainConfig

#: Model fields a fine-tuning run may set over the model's own values (every other one is the model's).
SETTABLE = ("dropout", "dropatt", "tgt_len", "mem_len", "ext_len", "clamp_len", "same_length",
            "init", "init_range", "init_std", "proj_init_std")  # the init_* fields: unused, the weights are loaded
#: The key of the record in the run's ``config.json``.
RECORD = "init_from"


@dataclass
class InitSource:
    """A verified pretrained model to start from: its directory, model, vocabulary and weights' SHA-256."""

    path: Path  # as given
    model_dir: Path
    model: TransformerXLLM
    vocab: Vocab
    vocab_path: Path
    sha256: str

    @property
    def config(self) -> dict[str, Any]:
        return self.model.config.to_dict()

    def record(self) -> dict[str, Any]:
        """What the run's ``config.json`` records under ``init_from``."""
        return {"path": str(self.model_dir.resolve()), "sha256": self.sha256, "vocab": str(self.vocab_path.resolve()),
                "vocab_sha256": self.vocab.sha256()}

    def model_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """:func:`merged_overrides` over this model's config."""
        return merged_overrides(self.config, overrides, self.path)

    def load_into(self, model: TransformerXLLM) -> None:
        """Copy the pretrained weights into the run's freshly built ``model``."""
        model.load_state_dict(self.model.state_dict())


def merged_overrides(own: dict[str, Any], overrides: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """The model fields ``own`` (but ``n_token``) with the :data:`SETTABLE` ones of ``overrides``; a one-line
    :class:`ConfigError` for any other field of ``overrides`` that differs from its value in ``own``, and for a
    changed position-table length of attn_type 1 and 3."""
    for key, value in overrides.items():
        if key in SETTABLE or key == "n_token":
            continue
        try:
            same = TXLConfig.from_dict({**own, key: value}).to_dict()[key] == own[key]
        except ConfigError:
            same = False
        if not same:
            raise ConfigError(f"--{key.replace('_', '-')} {_shown(value)} conflicts with the model of --init-from "
                              f"{source} ({key}={_shown(own[key])}): fine-tuning keeps the model's architecture; "
                              f"only {', '.join(SETTABLE[:7])} may be set")
    merged = {k: v for k, v in own.items() if k != "n_token"}
    merged.update({k: v for k, v in overrides.items() if k in SETTABLE})
    old, new = TXLConfig.from_dict(own), TXLConfig.from_dict({**merged, "n_token": own["n_token"]})
    if new.attn_type in (1, 3) and new.max_klen != old.max_klen:
        raise ConfigError(f"attn_type {new.attn_type} learns a position table of tgt_len + ext_len + mem_len = "
                          f"{old.max_klen} rows: the model of --init-from {source} needs that sum kept "
                          f"(got {new.max_klen})")
    return merged


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value).replace(" ", "")


def open_init(path: str | Path, vocab: str | Path | None = None, *, verify: bool = True) -> InitSource:
    """The model behind ``path`` (verified) and its vocabulary (``vocab``, else the one beside the model); one-line
    errors for what is missing, damaged or inconsistent. ``vocab`` may name a dataset (``wt103``: the vocabulary of
    its prepared cache, :func:`transformer_xl.data.named_vocab.resolve_vocab`)."""
    from transformer_xl.data.named_vocab import resolve_vocab
    from transformer_xl.inference.loading import load_model

    vocab = resolve_vocab(vocab, flag="--init-vocab")  # a name without a prepared cache is refused before loading
    model, model_dir = load_model(path, verify=verify)
    try:
        vocab_path = find_vocab(model_dir, vocab)
    except CheckpointError:
        raise ConfigError(f"--init-from {path}: no vocabulary beside the model ({model_dir}/vocab.json); pass "
                          "--init-vocab PATH (the txl vocabulary JSON it was trained with) or a dataset name "
                          "(wt103)") from None
    if not vocab_path.is_file():
        raise ConfigError(f"--init-vocab {vocab_path}: no such file")
    words = Vocab.load(vocab_path)
    if len(words) != model.config.n_token:
        raise DataError(f"the vocabulary {vocab_path} has {len(words)} symbols but the model of --init-from {path} "
                        f"predicts {model.config.n_token}: not its vocabulary")
    return InitSource(Path(path), model_dir, model, words, vocab_path, sha256_file(model_dir / WEIGHTS))


def init_setup(cfg: TrainConfig, plan: Any, run: RunDir, corpus: Any, *,
               main: bool) -> tuple[TrainConfig, Any, InitSource | None, dict[str, Any] | None]:
    """What a :class:`~transformer_xl.train.trainer.Trainer` needs of ``cfg.init_from``: the config with the model's
    architecture, the corpus encoded with its vocabulary (``corpus`` if given, checked), the model to copy the
    weights from (``None`` when a checkpoint is resumed: the run's own vocabulary is used) and the record of
    ``config.json``. Without ``init_from``: ``cfg``, the dataset's corpus, ``None``, ``None``."""
    from transformer_xl.data import load_corpus

    if not cfg.init_from:
        if corpus is None:
            corpus = load_corpus(cfg.dataset, cfg.data_dir, **cfg.corpus_options())
        return cfg, corpus, None, None
    init = record = None
    if plan is None or plan.checkpoint is None:  # a new run, or one started again before its first checkpoint
        init = open_init(cfg.init_from, cfg.init_vocab)
        cfg = dataclasses.replace(cfg, model_overrides=init.model_overrides(cfg.model_overrides))
        vocab, record = init.vocab, init.record()
    else:  # resumed from a checkpoint: the weights come from it, the vocabulary is the run's
        cfg = dataclasses.replace(cfg, model_overrides=merged_overrides(plan.model, cfg.model_overrides, cfg.init_from))
        vocab = Vocab.load(run.vocab)
        record = read_json(run.config, f"run config {run.config}", CheckpointError).get(RECORD)
    if corpus is None:
        corpus = load_corpus(cfg.dataset, cfg.data_dir, vocab=vocab, **cfg.corpus_options())
    elif corpus.vocab.sha256() != vocab.sha256():
        raise DataError(f"the corpus given to the trainer is not encoded with the vocabulary of --init-from "
                        f"{cfg.init_from} ({len(corpus.vocab)} vs {len(vocab)} symbols)")
    unknown = corpus.unknown_tokens("train") if hasattr(corpus, "unknown_tokens") else None
    if main and unknown is not None:
        total = int(corpus.splits["train"].shape[0])
        print(f"txl train: {unknown:,} of {total:,} training tokens ({100 * unknown / max(total, 1):.2f} %) are not "
              f"in the model's vocabulary and map to {vocab.unk or '<unk>'}", file=sys.stderr)
    return cfg, corpus, init, record


def write_record(run: RunDir, record: dict[str, Any] | None) -> None:
    """Add ``init_from`` (the model, its weights' SHA-256, the vocabulary) to the run's ``config.json``."""
    if record is not None:
        data = read_json(run.config, f"run config {run.config}", CheckpointError)
        write_json(run.config, {**data, RECORD: record})
