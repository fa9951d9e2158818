"""Which vLLM releases kvtool models, and how a version the user typed becomes one of them.

Every rule that differs between releases is a row of a table keyed by the first release it applies to (``since``),
in the step that applies it (serve_defaults, reserve, capacity ...), each row naming the upstream file and function
it is read from; :func:`pick` finds the row of a release.  The sources are the releases' own wheels, unpacked by
tests/support/fetch_vllm_sources.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvtool.core.errors import UsageError

# Every V1 release from 0.10.0 to 0.33.0 (pypi.org/project/vllm/#history); each is modelled.
MODELLED_RELEASES: tuple[str, ...] = tuple(
    (
        "0.10.0 0.10.1 0.10.1.1 0.10.2 0.11.0 0.11.1 0.11.2 0.12.0 0.13.0 0.14.0 0.14.1 0.15.0 0.15.1 0.16.0 0.17.0 "
        "0.17.1 0.18.0 0.18.1 0.19.0 0.19.1 0.20.0 0.20.1 0.20.2 0.21.0 0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 "
        "0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0"
    ).split()
)
NEWEST_RELEASE = MODELLED_RELEASES[-1]  # the default of --vllm-version
OLDEST_RELEASE = MODELLED_RELEASES[0]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?P<rest>[.+-]?(?:rc|dev|post|a|b|\+).*)?$")


@functools.lru_cache(maxsize=256)
def version_key(version: str) -> tuple[int, ...]:
    """``"0.10.1.1"`` -> (0, 10, 1, 1); ``"0.19"`` -> (0, 19).  Cached: every rule table's :func:`pick` asks it of
    each row, half the time of a 2,000-candidate ``kvtool plan`` before."""
    return tuple(int(part) for part in version.split("."))


def resolve_vllm_version(text: str) -> str:
    """The modelled release for what the user typed: ``0.19.1``, ``v0.19.1``, ``0.19`` (its newest patch), or a
    build string as vLLM logs it (``0.11.1rc2.dev34+g1a2b``, ``0.10.2+cu128``: the release it is built on).

    A version outside 0.10.0-0.33.0, or a patch that was never released, is refused naming the nearest modelled one.
    """
    match = _VERSION.match(text.strip())
    if match is None:
        raise UsageError(
            f"--vllm-version takes a vLLM release such as {NEWEST_RELEASE}, not {text!r}",
            where="--vllm-version",
            tip=f"kvtool models vLLM {OLDEST_RELEASE} to {NEWEST_RELEASE}",
        )
    parts = [int(p) for p in match.groups()[:4] if p is not None]
    asked = tuple(parts)
    if len(asked) == 2:  # a minor release: its newest patch
        patches = [r for r in MODELLED_RELEASES if version_key(r)[:2] == asked]
        if patches:
            return patches[-1]
    elif (release := ".".join(map(str, asked))) in MODELLED_RELEASES:
        return release
    earlier = [r for r in MODELLED_RELEASES if version_key(r) <= asked]
    nearest = earlier[-1] if earlier else OLDEST_RELEASE  # the newest release not later than the one asked
    shown = ".".join(map(str, asked))
    raise UsageError(
        f"vLLM {shown} is not a release kvtool models (it models {OLDEST_RELEASE} to {NEWEST_RELEASE})",
        where="--vllm-version",
        tip=f"the nearest modelled release is {nearest}: pass --vllm-version {nearest}",
    )


class _Row(Protocol):
    @property
    def since(self) -> str: ...


RowT = TypeVar("RowT", bound=_Row)


def pick(rows: Sequence[RowT], version: str) -> RowT:
    """The row of a version-keyed table for ``version``: the newest row whose ``since`` is not later than it.

    Every table starts at or before :data:`OLDEST_RELEASE`, so every modelled release has a row.
    """
    asked = version_key(version)
    earlier = [row for row in rows if version_key(row.since) <= asked]
    if not earlier:
        raise ValueError(f"no row for vLLM {version}: the table starts at {min(r.since for r in rows)}")
    return max(earlier, key=lambda row: version_key(row.since))
