"""Fresh buffers that a computation writes whole, backed by huge pages where the system allows it.

A new ``[heads, n, n]`` weights buffer is memory the process has never touched: its first write faults in every
4 KB page (12,288 faults for 12 heads at 1,024 tokens, 48 MB), which took longer than the scores' product itself
(17-19 of the 22-26 ms it took; docs/benchmarks.md). Linux can back such a buffer with 2 MB pages instead when
asked (``madvise(MADV_HUGEPAGE)``, honoured when ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or
``always``): then its whole 2 MB pages fault once each. This is only asked for buffers the caller writes whole, so
no page is backed that would not be anyway: the memory used is the same.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import torch

from .cache import c_library

HUGE_PAGE = 2 << 20
# glibc maps a block this large on its own (its mmap threshold rises with the blocks freed, to 32 MB at most), and
# unmaps it when freed: the advice then dies with the buffer. A smaller block may come from the heap, whose pages are
# reused (no faults to save) and would keep the advice for whatever the heap holds next.
MIN_BYTES = 32 << 20
MADV_HUGEPAGE = 14
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Whether ``written_buffer`` asks for huge pages at all.
USE_HUGE_PAGES = True


@functools.cache
def _madvise():
    """libc's ``madvise`` when this system can give huge pages on request, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        if "[never]" in THP_SETTING.read_text():
            return None
    except OSError:
        return None
    libc = c_library()
    if libc is None or not hasattr(libc, "madvise"):
        return None
    advise = libc.madvise
    advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advise.restype = ctypes.c_int
    return advise


def huge_page_span(address: int, nbytes: int) -> tuple[int, int]:
    """``(start, length)`` of the whole huge pages inside ``nbytes`` bytes at ``address`` (length 0 if none)."""
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return start, max(0, end - start)


def written_buffer(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """``torch.empty(shape)`` for a buffer the caller will write whole: on CPU, from ``MIN_BYTES``, its whole 2 MB
    pages are advised to be huge pages before anything touches them (nothing is asked elsewhere, or when
    ``USE_HUGE_PAGES`` is off)."""
    buffer = torch.empty(shape, dtype=dtype, device=device)
    if USE_HUGE_PAGES and buffer.device.type == "cpu" and buffer.nbytes >= MIN_BYTES:
        advise = _madvise()
        if advise is not None:
            start, length = huge_page_span(buffer.data_ptr(), buffer.nbytes)
            if length:
                advise(start, length, MADV_HUGEPAGE)  # a refusal (-1) leaves ordinary pages: nothing to do
    return buffer
