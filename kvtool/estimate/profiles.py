"""Load and validate model and GPU profiles (YAML under ``profiles/``, plus user directories).

A model profile holds a ``config:`` block with Hugging Face config.json keys (copied from the published
config.json of ``hf_repo``) and is read by the same rules as a config.json (kvtool.estimate.hf_config).  A GPU profile
holds its memory size.  Every file is validated: unknown keys are rejected, types are checked, and errors name
the file and the field.  User directories (``--profiles DIR`` or ``KVTOOL_PROFILES``, ``os.pathsep``-separated)
hold ``models/*.yaml`` and ``gpus/*.yaml`` and take precedence over the built-in ones.  Nothing is loaded at
import time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from kvtool.core.errors import InputFileError, UsageError
from kvtool.estimate.hf_config import KNOWN_KEYS, ModelSpec, parse_config

ENV_VAR = "KVTOOL_PROFILES"


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    name: str
    hf_repo: str  # the Hugging Face repository whose config.json the values come from
    file: str
    config: dict
    aliases: tuple[str, ...] = ()
    description: str = ""
    published_params: int | None = None  # parameter count published on the model card / safetensors metadata


TFLOPS_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclasses.dataclass(frozen=True)
class DenseTflops:
    """Peak dense (not 2:4 sparse) tensor throughput per dtype, in TFLOPS (int8: TOPS); None where the GPU has none."""

    fp32: float | None = None
    tf32: float | None = None
    fp16: float | None = None
    bf16: float | None = None
    fp8: float | None = None
    int8: float | None = None

    def for_dtype(self, dtype: str) -> float | None:
        """The peak for a dtype in kvtool's spelling (``bfloat16``, ``fp8``, ``float32`` ...)."""
        key = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(
            dtype, dtype
        )
        if key.startswith("fp8"):
            key = "fp8"
        return getattr(self, key, None) if key in TFLOPS_DTYPES else None


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_bytes: int  # what the driver reports to CUDA/HIP (vLLM's total_gpu_memory); the budget starts from it
    memory_text: str  # the size as written in the profile, e.g. "79.22GiB"
    file: str
    vendor: str = ""
    aliases: tuple[str, ...] = ()
    source: str = ""
    nominal_memory_text: str = ""  # the datasheet size, e.g. "80GB" (for display only)
    nvidia_smi_mib: int | None = None  # nvidia-smi's total, where known
    memory_bandwidth_gb_s: float | None = None  # peak memory bandwidth, decimal GB/s
    peak_dense_tflops: DenseTflops = DenseTflops()
    evidence: tuple[str, ...] = ()  # public sources for the figures, one line each


_MODEL_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    # key: (accepted types, required)
    "name": ((str,), True),
    "hf_repo": ((str,), True),
    "config": ((dict,), True),
    "aliases": ((list,), False),
    "description": ((str,), False),
    "published_params": ((int,), False),
}
_GPU_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), True),
    "memory": ((str, int), True),  # what the driver reports (vLLM's total_gpu_memory), not the datasheet size
    "nominal_memory": ((str,), False),
    "nvidia_smi_mib": ((int,), False),
    "vendor": ((str,), False),
    "aliases": ((list,), False),
    "source": ((str,), False),
    "memory_bandwidth_gb_s": ((int, float), False),
    "peak_dense_tflops": ((dict,), False),
    "evidence": ((list,), False),
}


def builtin_dir() -> Path:
    """The built-in profiles: the installed ``kvtool.profiles`` package, or ``profiles/`` in a source tree."""
    import importlib.util

    spec = importlib.util.find_spec("kvtool.profiles")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parent.parent.parent / "profiles"


def search_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    """Profile roots, highest precedence first: ``--profiles`` dirs, then ``KVTOOL_PROFILES``, then built-in."""
    roots: list[Path] = []
    for item in extra:
        if not str(item).strip():  # Path("") is the current folder: an empty --profiles was read as "."
            raise UsageError("--profiles is empty", where="--profiles", tip="give a folder of profile YAML files")
        path = Path(item).expanduser()
        if not path.is_dir():
            raise UsageError(f"profile directory not found: {item}", where="--profiles")
        roots.append(path)
    for item in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if item.strip():
            path = Path(item.strip()).expanduser()
            if not path.is_dir():
                raise UsageError(f"profile directory not found: {item}", where=ENV_VAR)
            roots.append(path)
    roots.append(builtin_dir())
    return roots


def _kind_dirs(roots: list[Path], kind: str) -> list[Path]:
    out = []
    for root in roots:
        sub = root / kind
        if sub.is_dir():
            out.append(sub)
        elif kind == "models" and root != builtin_dir() and not (root / "gpus").is_dir():
            out.append(root)  # a user directory with model YAML files directly in it
    return out


def _read_yaml(file: Path) -> dict:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(f"cannot read profile: {err}", where=str(file)) from None
    from kvtool.estimate.parsed_profiles import cached

    parsed = cached(file, text, builtin_dir())  # a built-in profile as recorded in parsed.json: no PyYAML import
    if parsed is not None:
        return parsed
    import yaml

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise InputFileError(f"not valid YAML{line}: {problem}", where=str(file)) from None
    if not isinstance(data, dict):
        raise InputFileError("a profile must be a YAML mapping", where=str(file))
    return data


def _validate(data: dict, schema: dict[str, tuple[tuple[type, ...], bool]], file: Path) -> None:
    for key in data:
        if key not in schema:
            raise InputFileError(f"unknown key {key!r}; allowed: {', '.join(schema)}", where=f"{file}: field {key}")
    for key, (types, required) in schema.items():
        if key not in data:
            if required:
                raise InputFileError(f"missing required key {key!r}", where=f"{file}: field {key}")
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise InputFileError(
                f"{key} must be {'/'.join(t.__name__ for t in types)}, not {type(value).__name__}",
                where=f"{file}: field {key}",
            )
    for alias in data.get("aliases", []):
        if not isinstance(alias, str):
            raise InputFileError("aliases must be a list of strings", where=f"{file}: field aliases")


def _check_config_keys(config: dict, file: Path, prefix: str) -> None:
    for key, value in config.items():
        if key not in KNOWN_KEYS:
            raise InputFileError(
                f"unknown config key {key!r}",
                where=f"{file}: field {prefix}.{key}",
                tip="profiles may use only the config.json keys kvtool reads (see docs/estimate.md)",
            )
        if key == "text_config" and isinstance(value, dict):
            _check_config_keys(value, file, f"{prefix}.text_config")


def read_model_profile(file: Path) -> ModelProfile:
    data = _read_yaml(file)
    _validate(data, _MODEL_SCHEMA, file)
    _check_config_keys(data["config"], file, "config")
    return ModelProfile(
        name=data["name"],
        hf_repo=data["hf_repo"],
        file=str(file),
        config=data["config"],
        aliases=tuple(data.get("aliases", ())),
        description=data.get("description", ""),
        published_params=data.get("published_params"),
    )


def _dense_tflops(value: dict, file: Path) -> DenseTflops:
    for key, number in value.items():
        where = f"{file}: field peak_dense_tflops.{key}"
        if key not in TFLOPS_DTYPES:
            raise InputFileError(f"unknown dtype {key!r}; allowed: {', '.join(TFLOPS_DTYPES)}", where=where)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number < 1e6:
            raise InputFileError(f"{key} must be a positive number of TFLOPS, not {number!r}", where=where)
    return DenseTflops(**{key: float(number) for key, number in value.items()})


def _positive(data: dict, key: str, file: Path) -> None:
    value = data.get(key)
    if value is not None and not 0 < value < 1e9:
        raise InputFileError(f"{key} must be positive, not {value!r}", where=f"{file}: field {key}")


def read_gpu_profile(file: Path) -> GpuProfile:
    from kvtool.core.units import parse_size

    data = _read_yaml(file)
    _validate(data, _GPU_SCHEMA, file)
    try:
        memory = parse_size(str(data["memory"]), option="memory")
    except UsageError as err:
        raise InputFileError(err.message, where=f"{file}: field memory") from None
    for key in ("memory_bandwidth_gb_s", "nvidia_smi_mib"):
        _positive(data, key, file)
    if not all(isinstance(line, str) for line in data.get("evidence", [])):
        raise InputFileError("evidence must be a list of strings", where=f"{file}: field evidence")
    bandwidth = data.get("memory_bandwidth_gb_s")
    return GpuProfile(
        name=data["name"],
        memory_bytes=memory,
        memory_text=str(data["memory"]),
        file=str(file),
        vendor=data.get("vendor", ""),
        aliases=tuple(data.get("aliases", ())),
        source=data.get("source", ""),
        nominal_memory_text=data.get("nominal_memory", ""),
        nvidia_smi_mib=data.get("nvidia_smi_mib"),
        memory_bandwidth_gb_s=float(bandwidth) if bandwidth is not None else None,
        peak_dense_tflops=_dense_tflops(data.get("peak_dense_tflops", {}), file),
        evidence=tuple(data.get("evidence", ())),
    )


def _scan(dirs: list[Path], reader) -> list:
    seen: set[str] = set()
    out = []
    for d in dirs:
        for file in sorted(d.glob("*.yaml")):
            profile = reader(file)
            if profile.name.lower() not in seen:  # earlier directories override later ones
                seen.add(profile.name.lower())
                out.append(profile)
    return out


def list_models(extra: Iterable[str | Path] = ()) -> list[ModelProfile]:
    return _scan(_kind_dirs(search_dirs(extra), "models"), read_model_profile)


def list_gpus(extra: Iterable[str | Path] = ()) -> list[GpuProfile]:
    return _scan(_kind_dirs(search_dirs(extra), "gpus"), read_gpu_profile)


def _find(name: str, dirs: list[Path], reader, kind: str, option: str):
    key = name.strip().lower()
    for d in dirs:  # fast path: the file named after the profile
        file = d / f"{key}.yaml"
        if file.is_file():
            profile = reader(file)
            if profile.name.lower() == key:
                return profile
    found = _find_by_alias(key, dirs, reader)
    if found is not None:
        return found
    profiles = _scan(dirs, reader)
    for profile in profiles:
        if key == profile.name.lower() or key in (a.lower() for a in profile.aliases):
            return profile
    raise UsageError(f"unknown {kind} {name!r}", where=option, tip=_suggest(key, profiles, kind))


def _find_by_alias(key: str, dirs: list[Path], reader):
    """What :func:`_scan` then a match on name or alias finds, parsing only the files whose text holds ``key``
    (a profile naming it as its name or an alias has it in its text) and, for a match, the earlier files that could
    shadow it (whose text holds its name).  None when no such file matches: the caller scans them all (and so
    reports a broken profile, or suggests names)."""
    files = [file for d in dirs for file in sorted(d.glob("*.yaml"))]
    texts = []
    for file in files:
        try:
            texts.append(file.read_text(encoding="utf-8", errors="replace").lower())
        except OSError:
            return None  # the full scan says what is wrong with it
    for i, file in enumerate(files):
        if key not in texts[i]:
            continue
        profile = reader(file)
        name = profile.name.lower()
        if key != name and key not in (a.lower() for a in profile.aliases):
            continue
        if not any(name in texts[j] and reader(files[j]).name.lower() == name for j in range(i)):
            return profile  # not shadowed by an earlier profile of the same name
    return None


def _suggest(key: str, profiles: list, kind: str) -> str:
    from difflib import get_close_matches

    names = {p.name.lower(): p.name for p in profiles}
    for p in profiles:
        for alias in p.aliases:
            names.setdefault(alias.lower(), p.name)
    close = get_close_matches(key, list(names), n=3, cutoff=0.6)
    if close:
        return f"did you mean {', '.join(dict.fromkeys(names[c] for c in close))}? ('kvtool models' lists them all)"
    return f"'kvtool models' lists the known {kind}s"


def find_model(name: str, extra: Iterable[str | Path] = ()) -> ModelProfile:
    return _find(name, _kind_dirs(search_dirs(extra), "models"), read_model_profile, "model", "--model")


def find_model_by_repo(repo_id: str, extra: Iterable[str | Path] = ()) -> ModelProfile | None:
    """The profile whose ``hf_repo`` (or one of its ``aliases``: another checkpoint of the same architecture, such as
    the -Instruct one) is ``org/name`` (case-insensitive); None when no profile names it."""
    key = repo_id.strip().strip("/").lower()
    profiles = list_models(extra)
    for profile in profiles:
        if profile.hf_repo.lower() == key:
            return profile
    for profile in profiles:
        if key in (a.lower() for a in profile.aliases):
            return profile
    return None


def find_gpu(name: str, extra: Iterable[str | Path] = ()) -> GpuProfile:
    """A GPU profile by name or alias: driver-reported memory, bandwidth, dense peak TFLOPS per dtype, evidence.

    This is the accessor other commands use (the simulator's cost model reads ``memory_bandwidth_gb_s`` and
    ``peak_dense_tflops.for_dtype(...)``).
    """
    return _find(name, _kind_dirs(search_dirs(extra), "gpus"), read_gpu_profile, "GPU", "--gpu")


def model_spec(profile: ModelProfile) -> ModelSpec:
    """The ModelSpec of a profile, read with the config.json rules; errors name the profile file."""
    return parse_config(profile.config, where=f"{profile.file}: config", name=profile.name)
