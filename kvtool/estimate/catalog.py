"""What ``kvtool models`` lists: every profile that loads, and the files that do not.

Apart from kvtool.estimate.profiles (which ``kvtool estimate`` loads) so that an estimate never builds these classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from kvtool.core.errors import KvtoolError
from kvtool.estimate.profiles import (
    GpuProfile,
    _kind_dirs,
    model_spec,
    read_gpu_profile,
    read_model_profile,
    search_dirs,
)


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """One line of ``kvtool models``."""

    name: str
    attention: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    sliding_layers: int
    sliding_window: int | None
    state_layers: int  # hybrid models: layers with a per-request state (Mamba, Gated DeltaNet)
    published_params: int | None
    hf_repo: str
    file: str


@dataclasses.dataclass(frozen=True)
class SkippedProfile:
    """A profile file that does not load, left out of the catalog."""

    file: str
    reason: str  # the loader's error in one line: what is wrong and where (the file, and the field when one is)

    @property
    def warning(self) -> str:
        return f"skipped a profile that does not load: {self.reason}"


@dataclasses.dataclass(frozen=True)
class ProfileCatalog:
    """What ``kvtool models`` lists: every profile that loads, and the files that do not (each one warning)."""

    models: tuple[ModelSummary, ...]
    gpus: tuple[GpuProfile, ...]
    skipped: tuple[SkippedProfile, ...]


def _scan_loadable(dirs: list[Path], reader) -> tuple[list, list[SkippedProfile]]:
    """Like ``_scan``, but a file that does not load is skipped and named instead of ending the whole listing
    (one broken user profile made ``kvtool models`` fail)."""
    seen: set[str] = set()
    out, skipped = [], []
    for d in dirs:
        for file in sorted(d.glob("*.yaml")):
            try:
                profile = reader(file)
            except KvtoolError as err:
                skipped.append(SkippedProfile(str(file), err.one_line()))
                continue
            if profile.name.lower() not in seen:  # earlier directories override later ones
                seen.add(profile.name.lower())
                out.append(profile)
    return out, skipped


def _model_summary(file: Path) -> ModelSummary:
    profile = read_model_profile(file)
    spec = model_spec(profile)
    return ModelSummary(
        name=profile.name,
        attention=spec.attention_kind,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        dtype=spec.dtype,
        sliding_layers=spec.layer_kinds.count("sliding"),
        sliding_window=spec.sliding_window,
        state_layers=spec.state_layers,
        published_params=profile.published_params,
        hf_repo=profile.hf_repo,
        file=profile.file,
    )


def model_catalog(extra: Iterable[str | Path] = ()) -> ProfileCatalog:
    """Every model and GPU profile that loads, and the files that do not (``estimate --model NAME`` of a broken
    profile still fails: it goes through ``find_model``)."""
    roots = search_dirs(extra)
    models, skipped_models = _scan_loadable(_kind_dirs(roots, "models"), _model_summary)
    gpus, skipped_gpus = _scan_loadable(_kind_dirs(roots, "gpus"), read_gpu_profile)
    return ProfileCatalog(tuple(models), tuple(gpus), tuple(skipped_models + skipped_gpus))
