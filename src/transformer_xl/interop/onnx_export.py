"""Export a model to ONNX: the segment forward and the one-token step, memories in and out (``txl export onnx``).

An export directory holds everything generation needs without the PyTorch weights:

==========================  ========================================================================================
file                        what it holds
==========================  ========================================================================================
``segment.onnx``            one segment ``input_ids [B, Q]`` (a prompt, read ``tgt_len`` tokens at a time)
``step.onnx``               one new token ``input_ids [B, 1]`` (the generation step; the same graph at ``Q = 1``)
``onnx_export.json``        :data:`FORMAT`, the opset, the names, types and dynamic axes of every input and output
``config.json``             the model's :class:`~transformer_xl.model.TXLConfig`
``vocab.json``              the vocabulary (and ``tokenizer.json`` for a model trained with a subword tokenizer)
``MANIFEST.json``           the SHA-256 of every file (:mod:`transformer_xl.store.manifest`), checked on load, and
                            ``"output": "txl export onnx"`` (:mod:`transformer_xl.store.outputs`)
==========================  ========================================================================================

Both graphs take ``input_ids`` (int64) and the memories ``mem_0 .. mem_L`` (``L = n_layer``; float32
``[B, M, d_model]``, ``M >= 0``: the ``n_layer + 1`` tensors :class:`~transformer_xl.model.TransformerXLLM` returns,
the input of every layer and the final output) and return ``log_probs [B, n_token]`` (the next token's
log-probabilities after the last position) and ``new_mem_0 .. new_mem_L [B, M + Q, d_model]``: the memory followed
by the segment's hidden states. The model keeps the last ``mem_len`` positions of these (paper Sec. 3.2); the graph
leaves the cut to its caller, so the memory length of a generation is chosen when it runs, as ``--mem-len`` is
(:class:`~transformer_xl.interop.onnx_runtime.OnnxRuntimeLM` cuts).

Exported: the paper's relative encoding (``attn_type`` 0), with or without adaptive input and softmax, float32.
Refused in one line (:class:`ConfigError`): sampled softmax, ``same_length`` (its mask depends on ``mem_len``), the
other ``attn_type`` values, and int8-quantized models. The graphs come from ``torch.onnx.export(..., dynamo=True)``
(``torch.export``, then onnxscript) and are checked with ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_xl.errors import ConfigError, install_hint
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.pretrained import checked_vocab_json
from transformer_xl.store.files import atomic_dir, write_json, write_text
from transformer_xl.store.outputs import claim_output_dir, write_output_manifest
from transformer_xl.version import __version__

#: The ONNX opset of the graphs written.
OPSET = 18
#: What ``onnx_export.json`` says it is (``format``), read back by :mod:`transformer_xl.interop.onnx_runtime`.
FORMAT = "txl-onnx-1"
EXPORT_JSON = "onnx_export.json"
#: What ``MANIFEST.json`` says the directory is (:mod:`transformer_xl.store.outputs`): an export may replace it.
OUTPUT = "txl export onnx"
GRAPHS = {"segment": "segment.onnx", "step": "step.onnx"}
#: Largest batch, memory and segment length the graphs declare (the exporter's bounds of the dynamic axes).
MAX_DIM = 1 << 16
#: The memory length the graphs are traced with: no cut inside the graph (``M + Q`` stays below it).
_NO_CUT = 1 << 20
#: The example batch, memory and segment length the graphs are traced with: any size of 2 or more traces the same
#: graphs (0 or 1 would not: the exporter fixes an axis it sees at those sizes).
_EXAMPLE = 2
_INSTALL = install_hint("onnx")
#: What ``onnx_export.json`` says of the memories and of the log-probabilities.
MEMORY_DOC = ("mem_i: the memory of layer i's input (i = n_layer: the final output), the last positions of the text "
              "read so far, oldest first; empty (mem = 0) at the start of a text. new_mem_i: mem_i followed by this "
              "segment's positions; keep its last mem_len positions as the next mem_i.")
LOG_PROBS_DOC = "natural-log probabilities of the next token after the last position of input_ids"


def check_exportable(model: TransformerXLLM) -> None:
    """Refuse, in one line (:class:`ConfigError`), a model the exported graphs would not compute exactly."""
    cfg = model.config
    if getattr(model, "quantized", None) is not None:
        raise ConfigError(f"a {model.quantized}-quantized model is not exported to ONNX: export the float model")
    if cfg.sample_softmax > 0:
        raise ConfigError("a model with a sampled softmax (sample_softmax > 0) is not exported to ONNX: its "
                          "output layer is trained for sampling, export a model with the (adaptive) softmax")
    if cfg.attn_type != 0:
        raise ConfigError(f"only the paper's relative encoding (attn_type 0) is exported to ONNX, this model has "
                          f"attn_type {cfg.attn_type}")
    if cfg.same_length:
        raise ConfigError("a model with same_length is not exported to ONNX (its mask depends on mem_len); "
                          "generation with same_length off reads the same memory")
    if cfg.tf_memory:
        raise ConfigError("a model with tf_memory (the TF code's memory: mem_len zero states to start) is not "
                          "exported to ONNX, whose graphs start from an empty memory")
    p = next(model.parameters())
    if p.dtype != torch.float32 or p.device.type != "cpu":
        raise ConfigError(f"a float32 model on the CPU is exported to ONNX, this one is {p.dtype} on {p.device}: "
                          "model.float().cpu() first")


def require_onnx() -> Any:
    """The ``onnx`` module, or a one-line :class:`ConfigError` naming the extra that installs it."""
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter translates with it)
    except ImportError as exc:
        raise ConfigError(f"ONNX export needs the onnx extra ({exc.name} is missing): {_INSTALL}") from None
    return onnx


class _Segment(nn.Module):
    """``(input_ids, mems) -> (log_probs, *new_mems)``: one forward, the memories kept whole (no ``mem_len`` cut)."""

    def __init__(self, model: TransformerXLLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, mems: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        lengths = self.model.config.lengths(mem_len=_NO_CUT, ext_len=0)
        out = self.model(input_ids, None, list(mems), lengths=lengths)
        assert out.hidden is not None
        return (self.model.log_prob(out.hidden[:, -1]), *out.mems)  # [B, V], n_layer + 1 x [B, M + Q, D]


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    """The graphs' input and output names: ``input_ids, mem_0..mem_L`` and ``log_probs, new_mem_0..new_mem_L``."""
    mems = range(n_layer + 1)
    return ["input_ids", *(f"mem_{i}" for i in mems)], ["log_probs", *(f"new_mem_{i}" for i in mems)]


def describe(model: TransformerXLLM, *, opset: int = OPSET, text: dict[str, Any] | None = None) -> dict[str, Any]:
    """The contents of ``onnx_export.json``: format, opset, versions, and per graph its inputs and outputs with
    their element types and shapes (a name is a dynamic axis, a number a fixed one)."""
    cfg = model.config
    ins, outs = io_names(cfg.n_layer)
    graphs = {}
    for name, file in GRAPHS.items():
        q = 1 if name == "step" else "seq"
        mem_out = "mem+1" if name == "step" else "mem+seq"
        graphs[name] = {
            "file": file,
            "inputs": [{"name": ins[0], "type": "int64", "shape": ["batch", q]}]
            + [{"name": n, "type": "float32", "shape": ["batch", "mem", cfg.d_model]} for n in ins[1:]],
            "outputs": [{"name": outs[0], "type": "float32", "shape": ["batch", cfg.n_token]}]
            + [{"name": n, "type": "float32", "shape": ["batch", mem_out, cfg.d_model]} for n in outs[1:]],
        }
    return {
        "format": FORMAT, "opset": opset, "txl_version": __version__, "torch_version": torch.__version__,
        "graphs": graphs, "dynamic_axes": {"batch": [1, MAX_DIM], "seq": [1, MAX_DIM], "mem": [0, MAX_DIM]},
        "memory": MEMORY_DOC, "log_probs": LOG_PROBS_DOC,
        "lengths": {"mem_len": cfg.mem_len, "clamp_len": cfg.clamp_len, "tgt_len": cfg.tgt_len},
        "text": dict(text or {}),
    }


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's progress lines, warnings and log records kept off the console (its errors still raise)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_spec(config: TXLConfig, *, qlen: int | None) -> dict[str, Any]:
    """How a graph is traced (``torch.onnx.export``'s ``args``, ``dynamic_shapes``, ``input_names`` and
    ``output_names``): example inputs, batch and memory length dynamic, the segment length too unless ``qlen``."""
    q = qlen or _EXAMPLE
    ids = torch.zeros(_EXAMPLE, q, dtype=torch.long)
    mems = tuple(torch.zeros(_EXAMPLE, _EXAMPLE, config.d_model) for _ in range(config.n_layer + 1))
    b = torch.export.Dim("batch", min=1, max=MAX_DIM)
    m = torch.export.Dim("mem", min=0, max=MAX_DIM)
    ids_axes = {0: b} if qlen else {0: b, 1: torch.export.Dim("seq", min=1, max=MAX_DIM)}
    ins, outs = io_names(config.n_layer)
    return {"args": (ids, mems), "dynamic_shapes": (ids_axes, tuple({0: b, 1: m} for _ in mems)),
            "input_names": ins, "output_names": outs}


def _export_graph(module: _Segment, path: Path, *, qlen: int | None, opset: int) -> None:
    """Export ``module`` to ``path`` as :func:`export_spec` says (its progress lines kept off the console)."""
    with _quiet():
        torch.onnx.export(module, f=str(path), dynamo=True, opset_version=opset, external_data=False,
                          **export_spec(module.model.config, qlen=qlen))


def check_graph(path: str | Path) -> None:
    """``onnx.checker.check_model`` with ``full_check`` (strict type and shape inference) on the graph at ``path``."""
    require_onnx().checker.check_model(str(path), full_check=True)


def _write_beside(directory: Path, model: TransformerXLLM, *, vocab_json: str | None, tokenizer: str | Path | None,
                  text: dict[str, Any], opset: int) -> None:
    """Everything of an export directory but the graphs and the manifest: ``config.json``, the vocabulary, the
    tokenizer and ``onnx_export.json``."""
    text = dict(text)
    write_text(directory / "config.json", model.config.to_json())
    if vocab_json is not None:
        write_text(directory / "vocab.json", vocab_json)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, directory / "tokenizer.json")
        text["tokenizer"] = "tokenizer.json"
    write_json(directory / EXPORT_JSON, describe(model, opset=opset, text=text))


def export_onnx(model: TransformerXLLM, out_dir: str | Path, *, vocab: str | Any = None,
                tokenizer: str | Path | None = None, text: dict[str, Any] | None = None,
                opset: int = OPSET) -> Path:
    """Write the export directory of ``model`` (module docstring) to ``out_dir``, whole or not at all; returns it.

    ``vocab`` (a :class:`~transformer_xl.data.Vocab` or its JSON text, of ``n_token`` symbols) and ``tokenizer``
    (a subword tokenizer's JSON file, copied as ``tokenizer.json``) make the directory enough to generate text;
    ``text`` (e.g. ``{"level": "word"}``) is how text is split, recorded in ``onnx_export.json``. Both graphs pass
    ``onnx.checker.check_model(full_check=True)`` before the directory appears. ``out_dir`` must be absent, empty or
    an earlier export (:func:`transformer_xl.store.outputs.claim_output_dir`): anything else is refused in one line.
    The model, and each of its modules, is left in the train or eval mode it was found in."""
    check_exportable(model)
    require_onnx()
    vocab_json = checked_vocab_json(vocab, model.config.n_token)
    modes = [(m, m.training) for m in model.modules()]  # each module's own: a user may have frozen some
    model.eval()
    try:
        with claim_output_dir(out_dir, OUTPUT) as target, atomic_dir(target) as tmp, torch.no_grad():
            # the small files first: one that cannot be written fails in a moment, not after the graphs' export
            _write_beside(tmp, model, vocab_json=vocab_json, tokenizer=tokenizer, text=text or {}, opset=opset)
            module = _Segment(model)
            for name, file in GRAPHS.items():
                _export_graph(module, tmp / file, qlen=1 if name == "step" else None, opset=opset)
                check_graph(tmp / file)
            write_output_manifest(tmp, OUTPUT)
    finally:
        for m, training in modes:
            m.training = training
    return Path(out_dir)
