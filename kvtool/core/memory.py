"""Process memory settings for the commands that work on large numpy arrays (``kvtool analyze``)."""

from __future__ import annotations

import sys

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed memory instead of returning it to the system; True when applied.

    A large numpy array is by default its own mmap, unmapped when freed: the next array of that size faults every
    page in again (the kernel zeroes each one; on a virtual machine each fault can also exit to the host).  With
    arrays up to 1 GiB served from the heap and the heap never trimmed, the many same-sized temporaries of
    ``kvtool analyze`` reuse the pages already touched: fewer page faults, less system time, at the cost of
    keeping the peak in the process until it exits.  One arena for all threads: otherwise the second thread of the
    analysis allocates from an arena of its own and never reuses what the first freed (5M-event benchmark: system
    time 0.12-0.19 s -> 0.12-0.15 s, peak 560 -> 530 MB).  Meant for the CLI's own process (set before the work
    starts and before any thread); a no-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: leave its allocator as it is
        return False
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, _KEEP_BYTES),
            (_M_TRIM_THRESHOLD, _KEEP_BYTES),
            (_M_TOP_PAD, 64 << 20),
            (_M_ARENA_MAX, 1),
        )
    )


def arrow_on_the_heap() -> bool:
    """Let Arrow allocate from glibc's heap too (its system pool), kept as :func:`keep_freed_memory` keeps it.

    For a fleet read file after file in one process.  Arrow's default pool (mimalloc) and glibc's heap each keep
    the high-water mark of their own: the read's buffers in one, the analysis' arrays in the other.  On one heap
    the analysis reuses the pages the read freed and the next read reuses the analysis', so no page is faulted in
    twice and neither allocator holds a peak the other cannot use.  Nothing is handed back to the system until the
    process ends (``kvtool.events.load`` does not trim this pool).  True when applied; a no-op off glibc.
    """
    if not keep_freed_memory():
        return False
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    return True
