"""Running an exported model on ONNX Runtime (``txl generate --backend onnxruntime``).

:class:`OnnxRuntimeLM` opens an export directory (:mod:`transformer_xl.interop.onnx_export`): its files checked
against ``MANIFEST.json``, its ``config.json`` read, both graphs loaded into ONNX Runtime sessions on the CPU.
:meth:`OnnxRuntimeLM.advance` reads one segment after the memories and returns the next-token log-probabilities and
the new memories (the last ``mem_len`` positions); :class:`OnnxRecurrence` carries them over the segments of one
text, as :class:`transformer_xl.model.Recurrence` does for the PyTorch model, so that generation
(:func:`transformer_xl.inference.generate.stream`) runs its one loop, its sampling and its stops on either::

    lm = OnnxRuntimeLM("exported/")
    out = generate(lm, ids, max_new_tokens=50)          # the same tokens as generate(model, ids, ...)

Tensors cross as NumPy arrays without a copy (``torch.from_numpy``). A directory that is missing, incomplete,
changed after it was written or not an export, and graphs ONNX Runtime cannot load, are refused in one line
(:class:`CheckpointError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError, ConfigError, install_hint
from transformer_xl.interop.onnx_export import EXPORT_JSON, FORMAT, GRAPHS, io_names
from transformer_xl.model import Lengths, TXLConfig
from transformer_xl.store.files import read_json
from transformer_xl.store.manifest import verify_manifest

_INSTALL = install_hint("onnx")


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
        if verify:
            verify_manifest(directory, required=True, what="ONNX export")
        self.info = read_json(directory / EXPORT_JSON, error=CheckpointError)
        if self.info.get("format") != FORMAT:
            raise CheckpointError(f"{directory / EXPORT_JSON} has format {self.info.get('format')!r}; this txl "
                                  f"reads {FORMAT!r} (export the model again)")
        self.config = TXLConfig.from_dict(read_json(directory / "config.json", error=CheckpointError))
        self.inputs, self.outputs = io_names(self.config.n_layer)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        # equivalent: inter-op threads serve ONNX Runtime's parallel execution mode only; these sessions are sequential
        options.inter_op_num_threads = 1  # pragma: no mutate
        self.sessions = {name: self._session(ort, directory / file, options) for name, file in GRAPHS.items()}

    @staticmethod
    def _session(ort: Any, path: Path, options: Any) -> Any:
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types (InvalidProtobuf, Fail, NoSuchFile, ...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"ONNX Runtime cannot load {path}: {first}") from None

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
        feed = {self.inputs[0]: ids.numpy()}
        for name, m in zip(self.inputs[1:], mems):
            feed[name] = np.ascontiguousarray(m.detach().to("cpu", torch.float32).numpy())
        graph = "step" if ids.size(1) == 1 else "segment"
        log_probs, *new = self.sessions[graph].run(self.outputs, feed)
        return torch.from_numpy(log_probs), [torch.from_numpy(m[:, max(0, m.shape[1] - mem_len):]) for m in new]


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
