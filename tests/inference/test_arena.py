"""Memory for what a decode step streams: huge-page buffers and the read-only tensors packed in step order."""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import pytest
import torch

from transformer_xl.inference.arena import ALIGN, HUGE_PAGE, huge_page_buffer, huge_page_zeros, into_arena


def test_a_huge_page_buffer_is_zero_aligned_and_writable() -> None:
    buf = huge_page_buffer(3 * HUGE_PAGE + 5)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 5 and not buf.any()
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert buf.data_ptr() % HUGE_PAGE == 0
    buf.fill_(7)
    assert int(buf.sum()) == 7 * buf.numel()
    z = huge_page_zeros((3, 4, 5), torch.bfloat16)
    assert z.shape == (3, 4, 5) and z.dtype == torch.bfloat16 and z.is_contiguous() and not z.any()


def _mapping(address: int) -> tuple[str, set[str]]:
    """The permissions (``rw-p``: private) and ``VmFlags`` of the mapping holding ``address`` (/proc/self/smaps)."""
    perms, inside = "", False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            perms, inside = head[1], lo <= address < hi
        elif inside and head[0] == "VmFlags:":
            return perms, set(head[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not Path("/proc/self/smaps").is_file(),
                    reason="Linux's madvise and /proc")
def test_the_buffer_is_private_memory_advised_to_use_huge_pages() -> None:
    """The kernel was asked for huge pages (``hg``: MADV_HUGEPAGE) on a private anonymous mapping (a shared one is
    shmem, whose huge pages follow another setting); a buffer of one byte is aligned too; an empty request maps
    nothing."""
    for nbytes in (1, 3 * HUGE_PAGE + 5):
        buf = huge_page_buffer(nbytes)
        perms, flags = _mapping(buf.data_ptr())
        assert perms.endswith("p") and "sh" not in flags and "hg" in flags, (nbytes, perms, flags)
        assert buf.data_ptr() % HUGE_PAGE == 0 and buf.numel() == nbytes
    assert huge_page_buffer(0).untyped_storage().nbytes() == 0


def test_without_the_advice_it_is_plain_memory(monkeypatch) -> None:
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    buf = huge_page_buffer(100)
    assert buf.numel() == 100 and buf.dtype == torch.uint8 and not buf.any()
    assert huge_page_buffer(0).numel() == 0


def test_a_kernel_that_refuses_the_advice_gives_plain_memory(monkeypatch) -> None:
    """``madvise`` failing (a kernel without transparent huge pages: EINVAL, as for an advice it does not know) is
    no error: the buffer is ordinary zeroed memory."""
    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 0x7FFF, raising=False)  # an advice no kernel knows
    buf = huge_page_buffer(3 * HUGE_PAGE + 5)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 5 and not buf.any()


def test_the_arena_copies_in_order_aligned_and_shares_a_view_given_twice() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(3, 5), torch.randn(7).to(torch.bfloat16)
    shared = torch.randn(2, 3)
    c = torch.randn(10)[2:8:2]  # a strided view: copied contiguous
    out = into_arena([a, shared, b, shared.detach(), c])
    assert all(torch.equal(x, y) for x, y in zip(out, [a, shared, b, shared, c]))
    assert all(t.is_contiguous() and t.data_ptr() % ALIGN == 0 for t in out)
    assert len({t.untyped_storage().data_ptr() for t in out}) == 1  # one buffer
    starts = [t.data_ptr() for t in out]
    assert starts[0] < starts[1] < starts[2] < starts[4] and out[3] is out[1]  # in order; the same view once
    assert starts[1] - starts[0] == ALIGN  # 60 bytes, rounded up to a whole line
    out[0].add_(1)
    assert not torch.equal(out[0], a)  # copies, not the tensors given


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_an_empty_list_and_odd_sizes(dtype) -> None:
    assert into_arena([]) == []
    t = torch.ones(3, dtype=dtype)
    assert torch.equal(into_arena([t])[0], t)
