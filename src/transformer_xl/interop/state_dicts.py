"""Reading other libraries' state dicts (no pickle of code, NaN/inf refused), checking a config against their
size before building its model, and filling in the names of tied parameters."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError, one_line
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.store.tensors import check_finite, load_tensors


def fill_tied(model: TransformerXLLM, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Add the names of tied parameters that a file left out (e.g. HF safetensors drops tied copies)."""
    own = model.state_dict()
    groups: dict[int, list[str]] = {}
    for name, t in own.items():
        groups.setdefault(t.data_ptr(), []).append(name)
    state = dict(state)
    for names in groups.values():
        present = [n for n in names if n in state]
        for other in present[1:]:
            if not torch.equal(state[other], state[present[0]]):
                raise CheckpointError(f"{present[0]} and {other} are tied in this config but hold different "
                                      "values in the checkpoint (check tie_weight / tie_projs)")
        if present:
            for n in names:
                state.setdefault(n, state[present[0]])
    return state


def check_size(cfg: TXLConfig, state: dict[str, Tensor], path: str | Path) -> None:
    """A one-line :class:`CheckpointError` when ``cfg`` has more parameters than ``state`` (read from ``path``)
    holds in all: such a model could not be filled from it, so it is not built (a wrong or hostile config of a
    huge model would otherwise allocate it first). Every parameter comes from a tensor of the file, so the
    file holds at least as many numbers (more when it repeats tied ones or keeps buffers)."""
    held, wanted = sum(t.numel() for t in state.values()), cfg.parameter_count()
    if wanted > held:
        raise CheckpointError(f"{path} holds {held:,} numbers but its config (n_layer={cfg.n_layer}, "
                              f"d_model={cfg.d_model}, n_token={cfg.n_token}) describes {wanted:,} parameters: "
                              "the config does not belong to these weights")


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a state dict from ``.safetensors`` or a ``torch.save``'d dict (``weights_only=True``); a floating
    tensor holding NaN or inf is refused."""
    state = _read_state_dict(Path(path))
    check_finite(state, path)
    return state


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        return load_tensors(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError) as exc:
        raise CheckpointError(
            f"{path} is not a plain state dict (it may be a whole pickled model as the official train.py saves; "
            "txl does not unpickle code). In an environment that has the official code run "
            "`torch.save(torch.load(PATH).state_dict(), 'state.pt')` and convert that file"
        ) from exc
    except Exception as exc:  # a damaged archive or pickle stream fails anywhere inside torch.load (fuzzing)
        raise CheckpointError(f"{path} is damaged: torch.load failed ({type(exc).__name__}: "
                              f"{one_line(exc)})") from exc
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def own_tensors(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every tied name holding its own copy, so that a safetensors file lists every name (txl's
    files record tied names as aliases that a plain ``safetensors.torch.load_file`` does not restore, and the
    official ``load_state_dict`` needs them all)."""
    seen: set[tuple] = set()
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        out[name] = t.clone() if key in seen else t
        seen.add(key)
    return out
