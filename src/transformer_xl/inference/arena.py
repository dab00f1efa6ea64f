"""Memory for what a decode step streams: huge pages, and the read-only tensors as one run in the order a step reads
them.

A batch-1 decode step reads a few hundred megabytes once each (:mod:`transformer_xl.inference.decode`). On 4 KiB
pages a core reads that far below the machine's streaming rate: every page needs its own translation and the
hardware prefetchers stop at page boundaries, and a step that jumps between many separately allocated matrices
restarts its streams at each one. ``benchmarks/decode_kernels.py`` measures both effects. So the captured decoder
(:class:`~transformer_xl.inference.captured.CapturedDecoder`) keeps

* its read-only tensors (packed weights, position keys) as views into one buffer, in step order
  (:func:`into_arena`), and
* its key/value rings in buffers of their own,

all in memory the kernel is asked to back with 2 MiB pages (:func:`huge_page_buffer`: ``madvise(MADV_HUGEPAGE)``,
which Linux honours when transparent huge pages are in ``madvise`` or ``always`` mode; elsewhere, or when the call
fails, ordinary memory: the same values, only slower).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import torch
from torch import Tensor

#: The huge page size the buffers are aligned to.
HUGE_PAGE = 2 * 2**20
#: Alignment of every tensor in an arena (a cache line, and one AVX-512 vector).
ALIGN = 64


def huge_page_buffer(nbytes: int) -> Tensor:
    """``nbytes`` of zeroed memory as a ``uint8`` tensor starting on a :data:`HUGE_PAGE` boundary, advised to be
    backed by huge pages (a private anonymous mapping; module docstring). Where that is not available: a plain
    ``torch.zeros``."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes <= 0:  # not Linux (or an empty request)
        return torch.zeros(max(nbytes, 0), dtype=torch.uint8)
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(advice)
    except (OSError, ValueError):  # no such advice here (a kernel without transparent huge pages)
        return torch.zeros(nbytes, dtype=torch.uint8)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps the mapping alive; zero until written
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes]


def huge_page_zeros(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """A zero tensor of ``shape`` and ``dtype`` in a :func:`huge_page_buffer` of its own."""
    numel = 1
    for n in shape:
        numel *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    return huge_page_buffer(numel * itemsize).view(dtype).view(*shape)


def into_arena(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Copies of ``tensors`` (CPU) as views into one :func:`huge_page_buffer`, in the given order, each starting on
    an :data:`ALIGN` boundary and contiguous. A view given twice (the same memory, shape and strides: a bias shared
    by every layer) becomes one copy, returned at each place."""
    key_of = [(t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) for t in tensors]
    offsets: dict[tuple, int] = {}
    end = 0
    for t, key in zip(tensors, key_of):
        if key not in offsets:
            offsets[key] = end
            end += -(-t.nbytes // ALIGN) * ALIGN
    buf = huge_page_buffer(end)
    copies: dict[tuple, Tensor] = {}
    out = []
    for t, key in zip(tensors, key_of):
        if key not in copies:
            start = offsets[key]
            view = buf[start:start + t.nbytes].view(t.dtype).view(t.shape)
            copies[key] = view.copy_(t)
        out.append(copies[key])
    return out
