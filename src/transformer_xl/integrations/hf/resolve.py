"""Where a name given to ``from_pretrained`` leads: a txl model directory, a Hugging Face TransfoXL directory, or a
Hub id, read through txl's own safe readers only.

transformers' own loaders would ``torch.load`` a ``pytorch_model.bin`` and the tokenizer would unpickle ``vocab.pkl``
(the remote-code hole behind TransfoXL's removal, CVE-2025-14921). Here nothing is unpickled by ``pickle``'s own
rules: weights come from ``model.safetensors`` (or a ``.bin`` read with ``weights_only=True``), and an old
vocabulary pickle is read by :func:`transformer_xl.interop.hf_vocab.read_hf_vocab_dict`, which builds no object it
does not know. A Hub id goes through :func:`transformer_xl.interop.hub.hub_model_dir`: converted once into txl's
layout, kept in txl's cache, offline with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

from pathlib import Path

from transformer_xl import hooks
from transformer_xl.data import Vocab
from transformer_xl.errors import CheckpointError
from transformer_xl.inference.loading import load_vocab
from transformer_xl.interop.hf import HF_CONFIG, from_hf
from transformer_xl.interop.hf_vocab import find_hf_vocab, load_hf_vocab
from transformer_xl.interop.hub import config_layout
from transformer_xl.model import TransformerXLLM
from transformer_xl.store.files import read_json
from transformer_xl.store.layout import find_vocab


def model_dir(name: str | Path, revision: str | None = None) -> Path:
    """The local directory ``name`` names: itself, or the txl directory of the Hub id ``ORG/NAME[@REVISION]``."""
    hub = hooks.layers().pretrained_dir(str(name), revision)
    if hub is not None:
        return hub
    path = Path(name)
    if not path.is_dir():
        raise CheckpointError(f"{name}: no such model directory (nor a Hub id ORG/NAME)")
    return path


def is_hf_layout(directory: Path) -> bool:
    """Whether ``directory`` holds a Hugging Face TransfoXL model rather than txl's (by its ``config.json``, as the
    Hub's files are told apart: :func:`transformer_xl.interop.hub.config_layout`)."""
    cfg = directory / HF_CONFIG
    return cfg.is_file() and config_layout(read_json(cfg, error=CheckpointError)) == "hf"


def load_model(directory: Path) -> TransformerXLLM:
    """The txl model in ``directory`` (either layout), in eval mode."""
    if is_hf_layout(directory):
        return from_hf(directory, verify=False).eval()
    return TransformerXLLM.from_pretrained(directory)


def load_directory_vocab(directory: Path) -> Vocab | None:
    """The vocabulary beside the model (txl's ``vocab.json``, or a Hugging Face ``vocab.pkl``/``vocab.bin``/
    ``vocab.txt`` read safely), or None when there is none."""
    if is_hf_layout(directory):
        found = find_hf_vocab(directory)
        return load_hf_vocab(found) if found is not None else None
    try:
        find_vocab(directory, None)
    except CheckpointError:  # a model directory without a vocabulary: ids only
        return None
    return load_vocab(directory)
