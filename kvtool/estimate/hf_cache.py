"""Find a Hugging Face repository's snapshot in the local hub cache, offline (never a network call).

The layout is huggingface_hub's (docs "Manage huggingface_hub cache-system"): ``<cache>/models--<org>--<name>/``
holds ``refs/main`` (a commit hash) and ``snapshots/<hash>/config.json``.  The cache is ``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (``XDG_CACHE_HOME`` moves ``~/.cache``).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The hub cache huggingface_hub would use, from the same environment variables."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "huggingface" / "hub"


def find_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The snapshot directory holding ``config.json`` for ``org/name``: the one ``refs/<revision>`` names, else
    the most recently modified; None when the repository is not cached."""
    repo = cache_dir() / ("models--" + repo_id.strip().strip("/").replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / revision
    if ref.is_file():
        named = snapshots / ref.read_text(encoding="utf-8").strip()
        if (named / "config.json").is_file():
            return named
    candidates = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
    return max(candidates, key=lambda d: d.stat().st_mtime) if candidates else None
