"""The server process's heap: freed memory handed back to the system, so that a server left running returns to its
resident size after the largest requests.

glibc's ``malloc`` keeps what a process frees for its next allocations, and raises its threshold for serving a large
block from its own ``mmap`` each time such a block is freed (up to 32 MiB): after a few long prompts or large bodies,
blocks of megabytes come from the heap and stay there once freed, fragmented among small ones.
:func:`fix_mmap_threshold` pins that threshold (every block of 256 KiB or more is mapped and unmapped by itself), and
:func:`release_free_memory` (``malloc_trim``) returns the free pages of every heap; the engine calls it whenever it
falls idle. Elsewhere than glibc both do nothing and say so (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold", "release_free_memory"]

#: The block size from which glibc serves each allocation by its own mapping (:func:`fix_mmap_threshold`).
MMAP_THRESHOLD = 256 * 1024
#: ``mallopt``'s parameter number for it (glibc's ``M_MMAP_THRESHOLD``).
_M_MMAP_THRESHOLD = -3
_LIBC: Any = None


def _glibc() -> Any:
    """glibc, or None where the C library has no ``malloc_trim`` (musl, macOS)."""
    global _LIBC
    if _LIBC is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _LIBC = lib
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``size`` bytes or more by its own mapping, whatever was freed before (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``, which also stops its dynamic raising); False where it cannot."""
    lib = _glibc()
    return lib is not None and bool(lib.mallopt(_M_MMAP_THRESHOLD, int(size)))


def release_free_memory() -> bool:
    """Hand the free pages of every heap back to the system (glibc's ``malloc_trim``); False where there is none or
    nothing was released."""
    lib = _glibc()
    return lib is not None and bool(lib.malloc_trim(0))
