"""A one-thread background runner for numpy/pyarrow work that releases the GIL."""

from __future__ import annotations


def in_background(fn, *args):
    """Run ``fn(*args)`` on one worker thread; return its Future (numpy and pyarrow release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=1)
    try:
        return executor.submit(fn, *args)
    finally:
        executor.shutdown(wait=False)
