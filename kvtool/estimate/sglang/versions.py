"""Which SGLang releases kvtool models, and how a version the user typed becomes one of them.

As kvtool/estimate/vllm_versions.py does for vLLM: every rule that differs between SGLang releases is a row of a
table keyed by the first release it applies to (``since``), each row naming the upstream file and function it is
read from; :func:`pick` finds the row of a release.  The sources are the releases' own wheels
(``pip download sglang==X --no-deps``), python/sglang/srt/... inside them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvtool.core.errors import UsageError

# Every release 0.4.0-0.5.23 (pypi.org/project/sglang/#history, `pip index versions sglang`).  From 0.5.11 the pool
# is sized by a configurator (srt/model_executor/pool_configurator.py DefaultPoolConfigurator, from 0.5.16 driven by
# srt/mem_cache/kv_cache_configurator.py KVCacheConfigurator), with the same rule as before for the models kvtool
# sizes; the post-capture resize of srt/model_executor/model_runner_components/kv_pool_runtime.py (0.5.16+) runs only
# with SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 (srt/environ.py, off by default in every release to 0.5.23).
MODELLED_RELEASES: tuple[str, ...] = tuple(
    (
        "0.4.0 0.4.0.post1 0.4.0.post2 0.4.1 0.4.1.post1 0.4.1.post2 0.4.1.post3 0.4.1.post4 0.4.1.post5 0.4.1.post6 "
        "0.4.1.post7 0.4.2 0.4.2.post1 0.4.2.post2 0.4.2.post3 0.4.2.post4 0.4.3 0.4.3.post1 0.4.3.post2 0.4.3.post3 "
        "0.4.3.post4 0.4.4 0.4.4.post1 0.4.4.post2 0.4.4.post3 0.4.4.post4 0.4.5 0.4.5.post1 0.4.5.post2 0.4.5.post3 "
        "0.4.6 0.4.6.post1 0.4.6.post2 0.4.6.post3 0.4.6.post4 0.4.6.post5 0.4.7 0.4.7.post1 0.4.8 0.4.8.post1 0.4.9 "
        "0.4.9.post1 0.4.9.post2 0.4.9.post3 0.4.9.post4 0.4.9.post5 0.4.9.post6 0.4.10 0.4.10.post1 0.4.10.post2 "
        "0.5.1 0.5.1.post1 0.5.1.post2 0.5.1.post3 0.5.2 0.5.3 0.5.3.post1 0.5.3.post2 0.5.3.post3 0.5.4 0.5.4.post1 "
        "0.5.4.post2 0.5.4.post3 0.5.5 0.5.5.post1 0.5.5.post2 0.5.5.post3 0.5.6 0.5.6.post1 0.5.6.post2 0.5.7 0.5.8 "
        "0.5.8.post1 0.5.9 0.5.10 0.5.10.post1 0.5.11 0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 0.5.14 0.5.15 "
        "0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23"
    ).split()
)
NEWEST_RELEASE = MODELLED_RELEASES[-1]  # the default of --sglang-version
OLDEST_RELEASE = MODELLED_RELEASES[0]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?(?:rc\d+|\.dev\d+|\+.*)*$")


@functools.lru_cache(maxsize=256)
def version_key(version: str) -> tuple[int, int, int, int]:
    """``"0.4.6.post5"`` -> (0, 4, 6, 5); ``"0.4.6"`` -> (0, 4, 6, 0)."""
    match = _VERSION.match(version.strip())
    if match is None:
        raise ValueError(f"not an SGLang version: {version!r}")
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch or 0), int(post or 0)


def resolve_sglang_version(text: str) -> str:
    """The modelled release for what the user typed: ``0.4.6.post5``, ``v0.5.2``, ``0.4.6`` (that release) or ``0.4``
    (its newest release); a build string such as ``0.5.2rc1`` or ``0.4.9+cu128`` is the release it is built on."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise UsageError(
            f"--sglang-version takes an SGLang release such as {NEWEST_RELEASE}, not {text!r}",
            where="--sglang-version",
            tip=f"kvtool models SGLang {OLDEST_RELEASE} to {NEWEST_RELEASE}",
        )
    major, minor, patch, post = match.groups()
    if patch is None:  # a minor release: its newest modelled release
        newest = [r for r in MODELLED_RELEASES if version_key(r)[:2] == (int(major), int(minor))]
        if newest:
            return newest[-1]
    shown = f"{major}.{minor}.{patch or 0}" + (f".post{post}" if post else "")
    if shown in MODELLED_RELEASES:
        return shown
    asked = (int(major), int(minor), int(patch or 0), int(post or 0))
    earlier = [r for r in MODELLED_RELEASES if version_key(r) <= asked]
    nearest = earlier[-1] if earlier else OLDEST_RELEASE
    raise UsageError(
        f"SGLang {shown} is not a release kvtool models (it models {OLDEST_RELEASE} to {NEWEST_RELEASE})",
        where="--sglang-version",
        tip=f"the nearest modelled release is {nearest}: pass --sglang-version {nearest}",
    )


class _Row(Protocol):
    @property
    def since(self) -> str: ...


RowT = TypeVar("RowT", bound=_Row)


def pick(rows: Sequence[RowT], version: str) -> RowT:
    """The row of a version-keyed table for ``version``: the newest row whose ``since`` is not later than it."""
    asked = version_key(version)
    earlier = [row for row in rows if version_key(row.since) <= asked]
    if not earlier:
        raise ValueError(f"no row for SGLang {version}: the table starts at {min(r.since for r in rows)}")
    return max(earlier, key=lambda row: version_key(row.since))
