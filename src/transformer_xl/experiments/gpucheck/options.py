"""The options every part of the GPU check reads (:class:`CheckOptions`): the device, tiny or full sizes, where the
results go, the seed, each part's time cap and the progress printer."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The parts of the check, in the order they run (see the package docstring for what each measures).
PARTS = ("a", "b", "c", "d", "e", "f")

#: Seconds each part may run on a GPU (full sizes), its process's start included. They add up to 450 s: with the
#: driver's start the check stays under 8 minutes even when every part runs to its cap (:data:`FULL_BUDGET_S`).
DEFAULT_CAPS = {"a": 110.0, "b": 150.0, "c": 40.0, "d": 60.0, "e": 45.0, "f": 45.0}
#: Seconds each part may run with ``--tiny``: a CPU run of 30-40 s in all on one quiet core (each part under 15 s);
#: the caps stop a hang, with room for a CI machine busy with the test suite.
TINY_CAPS = {"a": 120.0, "b": 90.0, "c": 60.0, "d": 60.0, "e": 120.0, "f": 90.0}
#: Seconds the whole check may take (full sizes): a part starts with at most what is left of it as its cap.
FULL_BUDGET_S = 465.0
TINY_BUDGET_S = 600.0


def print_flush(msg: str) -> None:
    """Print one progress line at once (the check runs unattended; a killed run still shows how far it got)."""
    print(msg, flush=True)
    sys.stdout.flush()


@dataclass
class CheckOptions:
    """What one run of the check does.

    ``caps`` overrides the default cap of a part (seconds); ``budget_s`` bounds the whole run (default
    :data:`FULL_BUDGET_S`, or :data:`TINY_BUDGET_S` with ``tiny``); ``compile`` runs the ``torch.compile`` rows
    compiled even with ``tiny`` (default: compiled on full sizes only); ``command`` is the command line recorded
    with the results; ``deadline`` is set by the driver in a part's process (``time.monotonic()`` by which the part
    must end: :meth:`time_left`)."""

    device: str = "cuda"
    tiny: bool = False
    out_dir: Path = Path("gpu-check-out")
    parts: tuple[str, ...] = PARTS
    seed: int = 0
    caps: dict[str, float] = field(default_factory=dict)
    budget_s: float | None = None
    compile: bool | None = None
    command: str = ""
    deadline: float | None = None
    log: Callable[[str], None] = print_flush

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.parts = tuple(self.parts)
        unknown = [p for p in (*self.parts, *self.caps) if p not in PARTS]
        if unknown:
            raise ValueError(f"unknown part(s) {', '.join(sorted(set(unknown)))}: the parts are {', '.join(PARTS)}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"the budget must be a positive number of seconds, got {self.budget_s}")
        if any(not c > 0 for c in self.caps.values()):
            raise ValueError(f"a part's cap must be a positive number of seconds, got {self.caps}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"the check runs on 'cuda' (or 'cuda:N') or 'cpu', got device {self.device!r}")

    @property
    def cuda(self) -> bool:
        """Whether the device is a CUDA device."""
        from transformer_xl.devices import is_cuda

        return is_cuda(self.device)

    @property
    def device_type(self) -> str:
        """``"cuda"`` or ``"cpu"``: what ``torch.autocast`` and ``GradScaler`` take."""
        return self.device.split(":")[0]

    @property
    def use_compile(self) -> bool:
        """Whether the ``torch.compile`` rows compile: by default on full sizes, not with ``tiny``."""
        return (not self.tiny) if self.compile is None else self.compile

    @property
    def budget(self) -> float:
        """Seconds the whole check may take."""
        if self.budget_s is not None:
            return float(self.budget_s)
        return TINY_BUDGET_S if self.tiny else FULL_BUDGET_S

    def cap(self, part: str) -> float:
        """Seconds ``part`` may run before it is reported as timed out."""
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}: the parts are {', '.join(PARTS)}")
        return float(self.caps.get(part, (TINY_CAPS if self.tiny else DEFAULT_CAPS)[part]))

    def time_left(self) -> float:
        """Seconds before :attr:`deadline` (infinite without one): a part skips its optional work when short."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU): every timing starts and ends with one."""
        from transformer_xl.devices import synchronize

        synchronize(self.device)

    # ------------------------------------------------------------------ to a part's process and back
    def to_dict(self) -> dict[str, Any]:
        """The options as JSON values (not ``log``): what a part's process is started with."""
        return {"device": self.device, "tiny": self.tiny, "out_dir": str(self.out_dir), "parts": list(self.parts),
                "seed": self.seed, "caps": dict(self.caps), "budget_s": self.budget_s, "compile": self.compile,
                "command": self.command, "deadline": self.deadline}

    @classmethod
    def from_dict(cls, data: dict[str, Any], log: Callable[[str], None] = print_flush) -> CheckOptions:
        """The options :meth:`to_dict` wrote, printing with ``log``."""
        return cls(**{**data, "parts": tuple(data["parts"]), "out_dir": Path(data["out_dir"]), "log": log})
