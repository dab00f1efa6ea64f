"""Running an exported model on ONNX Runtime (``txl generate --backend onnxruntime``).

:class:`OnnxRuntimeLM` opens an export directory (:mod:`transformer_xl.interop.onnx_export`): its files checked
against ``MANIFEST.json``, its ``config.json`` read, both graphs loaded into ONNX Runtime sessions on the CPU.
:meth:`OnnxRuntimeLM.advance` reads one segment after the memories and returns the next-token log-probabilities and
the new memories (the last ``mem_len`` positions); :class:`OnnxRecurrence` carries them over the segments of one
text, as :class:`transformer_xl.model.Recurrence` does for the PyTorch model, so that generation
(:func:`transformer_xl.inference.generate.stream`) runs its one loop, its sampling and its stops on either::

    lm = OnnxRuntimeLM("exported/")
    out = generate(lm, ids, max_new_tokens=50)          # the same tokens as generate(model, ids, ...)

Tensors cross as NumPy arrays without a copy (``torch.from_numpy``). Refused in one line (:class:`CheckpointError`):
a directory that is missing, not an export, or changed after it was written: its ``MANIFEST.json`` must list, with
their SHA-256, every file txl reads from it (:data:`READ`, and ``vocab.json`` and the tokenizer when there), so a
graph swapped in later is refused before ONNX Runtime sees it; a graph ONNX Runtime cannot load, or whose inputs and
outputs are not this export's (:func:`check_graph_io`, also with ``verify=False``); a graph that fails as it runs.
Token ids outside the vocabulary and memories of the wrong shape are a :class:`ConfigError` before the graph runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError, ConfigError, install_hint, one_line
from transformer_xl.interop.onnx_export import EXPORT_JSON, FORMAT, GRAPHS, io_names
from transformer_xl.model import Lengths, TXLConfig
from transformer_xl.store.files import check_plain_name, read_json
from transformer_xl.store.layout import CONFIG, VOCAB
from transformer_xl.store.manifest import MANIFEST, verify_manifest

_INSTALL = install_hint("onnx")
#: The files every load reads (the graphs, ``onnx_export.json``, ``config.json``): its manifest must list them, as it
#: must list ``vocab.json`` and the tokenizer when the directory holds them (generation reads them).
READ = (EXPORT_JSON, CONFIG, *GRAPHS.values())


def _require_ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(f"the onnxruntime backend needs the onnx extra (onnxruntime is missing): {_INSTALL}") \
            from None
    return onnxruntime


def is_export_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding an ONNX export (its ``onnx_export.json``)."""
    return (Path(path) / EXPORT_JSON).is_file()


class OnnxRuntimeLM:
    """An exported model on ONNX Runtime (module docstring).

    Args:
        directory: the export directory (``txl export onnx MODEL DIR``).
        verify: check its files against ``MANIFEST.json`` first (default).
        threads: ONNX Runtime's intra-op threads (default: torch's thread count, as the PyTorch backend).
    """

    def __init__(self, directory: str | Path, *, verify: bool = True, threads: int | None = None) -> None:
        ort = _require_ort()
        self.directory = directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointError(f"ONNX export directory not found: {directory}")
        if not is_export_dir(directory):
            raise CheckpointError(f"{directory} is not an ONNX export (no {EXPORT_JSON}; make one with txl export "
                                  "onnx MODEL DIR)")
        manifest = verify_manifest(directory, required=True, what="ONNX export") if verify else None
        self.info = read_json(directory / EXPORT_JSON, error=CheckpointError)
        if self.info.get("format") != FORMAT:
            raise CheckpointError(f"{directory / EXPORT_JSON} has format {self.info.get('format')!r}; this txl "
                                  f"reads {FORMAT!r} (export the model again)")
        text = self.info.get("text") or {}
        tokenizer = text.get("tokenizer") if isinstance(text, dict) else None
        if tokenizer is not None:  # generation reads it from the directory: a name inside it
            check_plain_name(tokenizer, f"{directory / EXPORT_JSON} (text.tokenizer)", CheckpointError)
        if manifest is not None:
            check_listed(directory, manifest, [*READ, *(n for n in (VOCAB, tokenizer) if n is not None
                                                        and (directory / n).exists())])
        self.config = TXLConfig.from_dict(read_json(directory / CONFIG, error=CheckpointError))
        self.inputs, self.outputs = io_names(self.config.n_layer)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        # equivalent: inter-op threads serve ONNX Runtime's parallel execution mode only; these sessions are sequential
        options.inter_op_num_threads = 1  # pragma: no mutate
        self.sessions = {name: self._session(ort, directory / file, options) for name, file in GRAPHS.items()}
        for name, session in self.sessions.items():
            check_graph_io(directory / GRAPHS[name], session, name, self.config)

    @staticmethod
    def _session(ort: Any, path: Path, options: Any) -> Any:
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types (InvalidProtobuf, Fail, NoSuchFile, ...)
            raise CheckpointError(f"ONNX Runtime cannot load {path}: {one_line(exc, limit=1000)}") from None

    def empty_mems(self, batch: int) -> list[Tensor]:
        """Memories of no text: ``n_layer + 1`` tensors ``[batch, 0, d_model]``."""
        return [torch.zeros(batch, 0, self.config.d_model) for _ in range(self.config.n_layer + 1)]

    def advance(self, input_ids: Tensor, mems: list[Tensor] | None, *, mem_len: int) -> tuple[Tensor, list[Tensor]]:
        """Read the segment ``input_ids [B, Q]`` after ``mems`` (``None`` or ``[]``: the start of a text): the
        next-token log-probabilities ``[B, n_token]`` and the memories of the last ``mem_len`` positions read.
        One token runs the step graph, longer segments the segment graph."""
        ids = input_ids.detach().to("cpu", torch.long)
        if ids.dim() != 2 or ids.numel() == 0:
            raise ConfigError(f"input_ids must be [batch, time] with at least one token, got {tuple(ids.shape)}")
        mems = list(mems) if mems else self.empty_mems(ids.size(0))
        if len(mems) != self.config.n_layer + 1:
            raise ConfigError(f"expected {self.config.n_layer + 1} memory tensors, got {len(mems)}")
        check_inputs(ids, mems, self.config)
        feed = {self.inputs[0]: ids.numpy()}
        for name, m in zip(self.inputs[1:], mems):
            feed[name] = np.ascontiguousarray(m.detach().to("cpu", torch.float32).numpy())
        graph = "step" if ids.size(1) == 1 else "segment"
        try:
            log_probs, *new = self.sessions[graph].run(self.outputs, feed)
        except Exception as exc:  # onnxruntime's own error types: a graph that is not this export's
            raise CheckpointError(f"ONNX Runtime failed running {self.directory / GRAPHS[graph]}: {one_line(exc)} "
                                  "(export the model again)") from None
        return torch.from_numpy(log_probs), [torch.from_numpy(m[:, max(0, m.shape[1] - mem_len):]) for m in new]


def check_listed(directory: Path, manifest: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse, in one line, an export whose manifest (just verified) does not list one of the files ``names`` that
    txl reads from it: a file added or swapped in after the export would be read unchecked."""
    for name in names:
        if name not in manifest["files"]:
            raise CheckpointError(f"{directory / MANIFEST} does not list {name}, which txl reads from the export (a "
                                  "file added or replaced after the export): export the model again")


def check_graph_io(path: Path, session: Any, graph: str, config: TXLConfig) -> None:
    """Refuse, in one line, a graph whose inputs and outputs are not those the export of ``config`` has
    (:func:`~transformer_xl.interop.onnx_export.io_names`): another model's graph, or the other graph of the pair."""
    ins, outs = io_names(config.n_layer)
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    if set(inputs) != set(ins) or not set(outs) <= outputs:
        raise CheckpointError(f"{path} is not this export's {graph} graph: it takes {sorted(inputs)} and gives "
                              f"{sorted(outputs)}, where config.json (n_layer {config.n_layer}) needs {ins} and "
                              f"{outs}; export the model again")
    ids_shape = inputs[ins[0]]
    seq = ids_shape[1] if len(ids_shape) == 2 else 0  # an int: fixed; a name (or None): dynamic
    dims = {n: inputs[n][2] for n in ins[1:] if len(inputs[n]) == 3}
    wrong_dim = [n for n, d in dims.items() if isinstance(d, int) and d != config.d_model]
    wrong_seq = isinstance(seq, int) and (graph == "segment" or seq != 1)  # the step reads 1 token, the segment any
    if len(dims) != len(ins) - 1 or wrong_dim or wrong_seq:
        raise CheckpointError(f"{path} is not this export's {graph} graph: its inputs have the shapes {inputs}, "
                              f"where config.json needs input_ids [batch, {1 if graph == 'step' else 'seq'}] and "
                              f"memories [batch, mem, {config.d_model}]; export the model again")


def check_inputs(ids: Tensor, mems: list[Tensor], config: TXLConfig) -> None:
    """Refuse, in one line (:class:`ConfigError`), token ids outside the vocabulary and memories that are not
    ``[batch, M, d_model]`` with the ids' batch and one ``M``."""
    if int(ids.min()) < 0 or int(ids.max()) >= config.n_token:
        raise ConfigError(f"token ids must lie in [0, {config.n_token}), got {int(ids.min())}..{int(ids.max())}")
    batch, lengths = ids.size(0), {m.size(1) if m.dim() == 3 else -1 for m in mems}
    for i, m in enumerate(mems):
        if m.dim() != 3 or m.size(0) != batch or m.size(2) != config.d_model or len(lengths) != 1:
            raise ConfigError(f"memory {i} must be [batch {batch}, positions, d_model {config.d_model}] like the "
                              f"others, got {tuple(m.shape)}")


class OnnxRecurrence:
    """The memories of one text read by an :class:`OnnxRuntimeLM`: :meth:`next_log_probs` reads segments in order
    and keeps the memories (``mem_len`` of ``lengths``) for the next call. ``lengths.clamp_len`` must be the one
    the graphs were exported with (the model's)."""

    def __init__(self, lm: OnnxRuntimeLM, lengths: Lengths, *, mems: list[Tensor] | None = None) -> None:
        if lengths.clamp_len != lm.config.clamp_len or lengths.same_length != lm.config.same_length:
            raise ConfigError(f"the ONNX graphs were exported with clamp_len {lm.config.clamp_len} and same_length "
                              f"{lm.config.same_length}; these are fixed in them (export again to change them)")
        self.lm, self.mem_len = lm, lengths.mem_len
        self.mems: list[Tensor] = list(mems or [])

    def next_log_probs(self, segments: Iterable[Tensor]) -> Tensor:
        """Feed ``segments`` (``[B, Q]`` each) in order; the next-token log-probabilities ``[B, V]`` after the last."""
        log_probs = None
        for x in segments:
            log_probs, self.mems = self.lm.advance(x, self.mems, mem_len=self.mem_len)
        if log_probs is None:
            raise ConfigError("no segment to read")
        return log_probs
