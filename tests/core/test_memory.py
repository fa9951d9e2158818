"""keep_freed_memory: glibc keeps a freed large array's pages for the next one instead of unmapping them;
arrow_on_the_heap: Arrow's buffers come from that kept heap too."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

# The bytes glibc's heap holds free (mallinfo2's fordblks, glibc >= 2.33), for the probes below.
_HEAP_FREE = """
import ctypes, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
def heap_free():
    return libc.mallinfo2().fordblks
"""

# Allocates and frees a 64 MiB numpy array.  By default a block this large is its own mmap and is unmapped on
# free (the heap holds ~0 free); kept, it stays in the heap for the next array (>= 64 MiB free).
_NUMPY_PROBE = (
    _HEAP_FREE
    + """
import numpy as np
from kvtool.core.memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
a = np.ones(64 << 20, dtype=np.uint8)
del a
print(applied, heap_free())
"""
)

# Arrow allocates and frees a 64 MiB buffer, and kvtool asks Arrow to release its unused pages as after each
# column; arrow_on_the_heap puts Arrow on glibc's heap (its system pool), which keeps the freed buffer for the next
# allocation (numpy's or Arrow's) instead of trimming it.
_ARROW_PROBE = (
    _HEAP_FREE
    + """
import pyarrow as pa
from kvtool.core.memory import arrow_on_the_heap
from kvtool.events.load import release_arrow_pages
applied = arrow_on_the_heap() if sys.argv[1] == "arrow" else None
buf = pa.allocate_buffer(64 << 20)
del buf
release_arrow_pages()
print(applied, pa.default_memory_pool().backend_name, heap_free())
"""
)


def _probe(code: str, mode: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not glibc, reason="mallopt and mallinfo2 are glibc's")
def test_keep_freed_memory_keeps_a_freed_large_array_in_the_heap():
    applied, kept_free = _probe(_NUMPY_PROBE, "keep")
    assert applied == "True"
    assert int(kept_free) >= 64 << 20  # the whole array's memory is still the process's, ready for reuse
    assert int(_probe(_NUMPY_PROBE, "default")[1]) < 64 << 20  # without it, glibc unmapped the array on free


@pytest.mark.skipif(not glibc, reason="mallopt and mallinfo2 are glibc's")
def test_arrow_on_the_heap_frees_arrow_buffers_into_the_kept_heap():
    applied, backend, heap_free = _probe(_ARROW_PROBE, "arrow")
    assert (applied, backend) == ("True", "system") and int(heap_free) >= 64 << 20  # kept, not trimmed
    applied, backend, heap_free = _probe(_ARROW_PROBE, "default")
    assert backend != "system" and int(heap_free) < 64 << 20  # Arrow's own pool: nothing of it in glibc's heap
