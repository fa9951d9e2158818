"""A cap on the bytes a compressed input inflates to, counted while the decompression streams (a gzip bomb stops
at the cap, not after it filled the memory).

A 1 MB ``.csv.gz`` of one repeated row inflates to a gigabyte, and each inflated gigabyte of events becomes
several in memory (docs/analyze.md "Memory"): without a cap, a small hostile file drove ``kvtool analyze`` past
10 GB within half a minute.  Every reader of a compressed input counts through here: :class:`InflateCap` is the
counter (also a pyarrow ``TransformInputStream`` function), :func:`capped_binary` wraps a Python file object.
"""

from __future__ import annotations

import io
from typing import Any, Protocol

from kvtool.core.errors import InputFileError
from kvtool.core.units import GIB

# 8 GiB inflated: above every real events file we met (a 5M-event CSV is 0.3 GB), below the memory of the machines
# that analyse them (an inflated GiB of CSV events takes 2-3 GiB of memory, docs/analyze.md "Memory")
DEFAULT_MAX_INPUT_BYTES = 8 * GIB
MAX_INPUT_OPTION = "--max-input-bytes"
MAX_INPUT_ENV = "KVTOOL_MAX_INPUT_BYTES"


class Readable(Protocol):
    """A decompressing binary file object (gzip.GzipFile, a file object of fsspec)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class InflateCap:
    """Counts the decompressed bytes of one input and raises InputFileError (exit 3) past ``max_bytes``."""

    def __init__(self, where: str, max_bytes: int = DEFAULT_MAX_INPUT_BYTES):
        self.where = where
        self.max_bytes = max_bytes
        self.bytes_read = 0

    def count(self, size: int) -> None:
        self.bytes_read += size
        if self.bytes_read > self.max_bytes:
            raise too_large(self.where, self.max_bytes)

    def __call__(self, buffer: Any) -> Any:
        """pyarrow's TransformInputStream calls this with each decompressed buffer, which it passes on."""
        self.count(buffer.size)
        return buffer


def too_large(where: str, max_bytes: int) -> InputFileError:
    """The one error of an input past the cap: the file, the cap and the option that raises it, in one line."""
    from kvtool.core.format import fmt_bytes

    return InputFileError(
        f"the decompressed content is larger than {MAX_INPUT_OPTION} ({fmt_bytes(max_bytes)}): refused while "
        f"inflating (a gzip bomb?); for a genuine file raise {MAX_INPUT_OPTION} or {MAX_INPUT_ENV}",
        where=where,
    )


class _CappedRaw(io.RawIOBase):
    """A raw stream over a decompressing file object that counts what it hands out."""

    def __init__(self, inner: Readable, cap: InflateCap):
        self._inner = inner
        self._cap = cap

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        data = self._inner.read(len(buffer))
        self._cap.count(len(data))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def capped_binary(inner: Readable, cap: InflateCap) -> io.BufferedReader:
    """``inner`` (a ``gzip.open(..., "rb")``) as a buffered binary stream that stops at the cap."""
    return io.BufferedReader(_CappedRaw(inner, cap), buffer_size=1 << 20)


def read_capped(inner: Readable, cap: InflateCap) -> bytes:
    """All of ``inner`` (a decompressing stream), read in blocks so that a bomb stops at the cap."""
    parts = []
    while block := inner.read(1 << 24):
        cap.count(len(block))
        parts.append(block)
    return b"".join(parts)
