"""Which cache tensors share memory: untyped storage, byte ranges, and (where ranges meet) exact elements.

``data_ptr()`` alone misses views that start at different addresses of one allocation; a byte range alone
over-reports interleaved views (per-head views of a [S, H, d] tensor span overlapping ranges but touch
disjoint bytes).  So: same allocation and overlapping [byte_start, byte_end), then an exact check of
the element addresses (up to ``EXACT_LIMIT`` elements per tensor; beyond that the range decides).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EXACT_LIMIT = 4_000_000  # elements; above this two overlapping ranges count as shared without an exact check


@dataclass(frozen=True)
class Span:
    data_ptr: int
    storage_ptr: int
    byte_start: int
    byte_end: int


def span(t: torch.Tensor) -> Span:
    """The addresses a tensor view can touch (strides are never negative in torch)."""
    start = t.data_ptr()
    storage_ptr = t.untyped_storage().data_ptr()
    if t.numel() == 0:
        return Span(start, storage_ptr, start, start)
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return Span(start, storage_ptr, start, start + (extent + 1) * t.element_size())


def _byte_addresses(t: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(1, dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.int64) * stride).reshape(-1)
    return torch.unique(offsets) * t.element_size() + t.data_ptr()


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a write through one tensor can change the other."""
    if a.device != b.device:
        return False
    sa, sb = span(a), span(b)
    if sa.storage_ptr != sb.storage_ptr or sa.byte_start >= sb.byte_end or sb.byte_start >= sa.byte_end:
        return False
    exact = (
        a.element_size() == b.element_size()
        and (sa.data_ptr - sb.data_ptr) % a.element_size() == 0
        and max(a.numel(), b.numel()) <= EXACT_LIMIT
    )
    if not exact:
        return True
    return bool(torch.isin(_byte_addresses(a), _byte_addresses(b)).any())


def overlap_pairs(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Index pairs (i < j) of tensors that share memory; ranges are sorted so most pairs are skipped."""
    spans = [span(t) for t in tensors]
    order = sorted(range(len(tensors)), key=lambda i: spans[i].byte_start)
    pairs = []
    for pos, i in enumerate(order):
        for j in order[pos + 1 :]:
            if spans[j].byte_start >= spans[i].byte_end:
                break
            if shares_memory(tensors[i], tensors[j]):
                pairs.append((min(i, j), max(i, j)))
    return sorted(pairs)
