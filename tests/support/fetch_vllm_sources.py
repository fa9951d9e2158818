"""Fetch the Python source of vLLM releases (never at test time): the files kvtool's version tables are read from.

    python -m tests.support.fetch_vllm_sources 0.10.0 0.19.1 0.33.0 --to ~/.cache/kvtool/vllm-src

Each release's wheel is fetched with ``pip download vllm==X --no-deps``; its ``.py`` files (the release's source)
are unpacked to ``DEST/X/vllm/...`` and the wheel (300-400 MB) is deleted.  With no versions given: every release
from 0.10.0 to 0.33.0.  The rules in kvtool/estimate/vllm_rules.py cite files and functions under these trees.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import zipfile

RELEASES = (
    "0.10.0 0.10.1 0.10.1.1 0.10.2 0.11.0 0.11.1 0.11.2 0.12.0 0.13.0 0.14.0 0.14.1 0.15.0 0.15.1 0.16.0 0.17.0 "
    "0.17.1 0.18.0 0.18.1 0.19.0 0.19.1 0.20.0 0.20.1 0.20.2 0.21.0 0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 "
    "0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0"
).split()


def fetch(version: str, dest: pathlib.Path) -> pathlib.Path:
    """Unpack vLLM ``version``'s Python files under ``dest/version``; skip a release already unpacked."""
    target = dest / version
    if (target / "vllm" / "__init__.py").is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "-q", "-d", tmp],
            check=True,
        )
        (wheel,) = pathlib.Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    archive.extract(name, target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(RELEASES))
    parser.add_argument("--to", default=str(pathlib.Path.home() / ".cache" / "kvtool" / "vllm-src"))
    args = parser.parse_args()
    dest = pathlib.Path(args.to).expanduser()
    for version in args.versions:
        print(f"{version}: {fetch(version, dest)}", file=sys.stderr)


if __name__ == "__main__":
    main()
