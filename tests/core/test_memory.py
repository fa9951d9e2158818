"""keep_freed_memory: glibc keeps a freed large array's pages for the next one instead of unmapping them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

# Allocates and frees a 64 MiB numpy array, then reports the bytes glibc's heap holds free (mallinfo2's fordblks,
# glibc >= 2.33).  By default a block this large is its own mmap and is unmapped on free (the heap holds ~0 free);
# kept, it stays in the heap for the next array (>= 64 MiB free).
_PROBE = """
import ctypes, sys
import numpy as np
from kvtool.core.memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
a = np.ones(64 << 20, dtype=np.uint8)
del a
print(applied, libc.mallinfo2().fordblks)
"""


def _probe(mode: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not glibc, reason="mallopt and mallinfo2 are glibc's")
def test_keep_freed_memory_keeps_a_freed_large_array_in_the_heap():
    applied, kept_free = _probe("keep")
    assert applied == "True"
    assert int(kept_free) >= 64 << 20  # the whole array's memory is still the process's, ready for reuse
    assert int(_probe("default")[1]) < 64 << 20  # without it, glibc unmapped the array on free
