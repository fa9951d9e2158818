"""The install's shape (pyproject.toml against the imports of the code) and ``kvtool.core.extras.require``.

`pip install kvtool` must pull no torch, matplotlib or GPU package (issue 24), each extra must bring what the code
behind its Tip imports, and ``dev`` everything the tests import.  The imports are read from the source with ``ast``,
so a new ``import`` of a package that no dependency or extra lists fails here.
"""

from __future__ import annotations

import ast
import re
import sys

import pytest

from kvtool.core.errors import EXIT_MISSING_EXTRA, MissingExtraError
from kvtool.core.extras import EXTRAS, require
from tests.support import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra brings tomli there
    import tomli as tomllib

# module imported -> its name on PyPI, where the two differ (what pip resolves, PEP 503 normalised below)
DISTRIBUTION_OF = {"yaml": "pyyaml", "zmq": "pyzmq", "distributed": "dask", "prometheus_client": "prometheus-client"}
# imported by code that runs inside an engine's own environment (the recorder plugin, the live-vLLM test drivers,
# tests/support/sglang_reference.py with SGLang's RadixCache and its msgspec publisher classes; lmcache, an unpacked
# wheel put on sys.path by tests/support/lmcache_key_fixture.py)
RUNS_INSIDE_VLLM = {"vllm", "sglang", "msgspec", "lmcache"}
MADE_AT_RUN_TIME = {"kvtool_api_targets"}  # kvtool.api.check_target's registry module (kvtool/api/_repro.py)


def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(requirement: str) -> str:
    """'dask[distributed]>=2024.1' -> 'dask' (PEP 503 normalised)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_name(r) for r in requirements}


def _third_party_imports(*folders: str) -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it (imports inside functions included)."""
    local = set(folders) | {p.stem for folder in folders for p in (REPO_ROOT / folder).rglob("*.py")}
    local |= {p.name for folder in folders for p in (REPO_ROOT / folder).rglob("*") if p.is_dir()}
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            if "tests/data" in path.as_posix():
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in {"kvtool", "tests"} | local:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def test_the_required_dependencies_hold_no_torch_matplotlib_or_gpu_package():
    required = _names(_project()["dependencies"])
    assert not required & {"torch", "matplotlib", "transformers", "triton"}
    assert not [name for name in required if name.startswith("nvidia")]
    # what estimate, analyze and simulate import; pandas, for kvtool.api's DataFrames, is the api extra
    assert required == {"typer", "rich", "pyyaml", "numpy", "pyarrow"}


def test_every_import_of_kvtool_is_a_dependency_or_behind_its_extra():
    required = _names(_project()["dependencies"])
    extras = {name: _names(reqs) for name, reqs in _project()["optional-dependencies"].items()}
    optional = {extra.module.split(".")[0]: extra for extra in EXTRAS.values()}
    optional["distributed"] = EXTRAS["dask.distributed"]  # dask.distributed is the distributed package's
    for module, files in _third_party_imports("kvtool").items():
        if module in RUNS_INSIDE_VLLM:
            continue
        distribution = DISTRIBUTION_OF.get(module, module)
        if distribution in required:
            continue
        assert module in optional, f"{module} (imported by {sorted(files)}) is neither required nor an extra"
        extra = optional[module]
        assert distribution in extras[extra.extra], f"extra '{extra.extra}' does not bring {distribution}"


def test_each_extra_brings_what_its_tip_names():
    extras = {name: _names(reqs) for name, reqs in _project()["optional-dependencies"].items()}
    for extra in EXTRAS.values():
        assert extra.distribution in extras[extra.extra], (extra.module, extra.extra)
        assert f"'kvtool[{extra.extra}]'" in extra.tip()
    assert extras["repro"] == {"torch"}
    assert extras["plots"] == {"matplotlib"}
    assert extras["hf"] == {"torch", "transformers"}  # transformers models run in PyTorch
    assert extras["capture"] == {"pyzmq", "msgpack"}
    assert extras["fleet"] == {"dask", "fsspec"}
    assert extras["api"] == {"pandas"}


def test_dev_brings_every_extra_and_everything_the_tests_import():
    project = _project()
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    dev = extras["dev"] | _names(project["dependencies"])
    for name, names in extras.items():
        assert names <= dev, f"dev lacks {sorted(names - dev)} of extra '{name}'"
    for module, files in _third_party_imports("tests", "benchmarks").items():
        if module not in RUNS_INSIDE_VLLM | MADE_AT_RUN_TIME:
            assert DISTRIBUTION_OF.get(module, module) in dev, f"{module} (imported by {sorted(files)}) is not in dev"


class _Blocker:
    """A meta-path finder that makes ``names`` uninstalled: their import raises ModuleNotFoundError."""

    def __init__(self, *names: str):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def uninstalled(monkeypatch):
    blockers: list[_Blocker] = []

    def block(*names: str) -> None:
        for name in names:
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                monkeypatch.delitem(sys.modules, loaded)
        blockers.append(_Blocker(*names))
        # in place, not a new list: a finder that a module imported meanwhile appends (tlz's, imported with dask)
        # must stay on sys.meta_path after the test
        sys.meta_path.insert(0, blockers[-1])

    yield block
    for blocker in blockers:
        sys.meta_path.remove(blocker)


def test_require_names_the_feature_the_module_and_the_extra(uninstalled):
    uninstalled("matplotlib")
    with pytest.raises(MissingExtraError) as caught:
        require("matplotlib", feature="kvtool analyze --plot")
    err = caught.value
    assert err.exit_code == EXIT_MISSING_EXTRA == 69
    assert err.one_line() == "kvtool analyze --plot needs matplotlib, which is not installed"
    assert err.tip == "pip install 'kvtool[plots]'"


def test_require_torch_tells_where_the_cpu_wheel_is(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # the other way a module is "not installed"
    with pytest.raises(MissingExtraError) as caught:
        require("torch", feature="kvtool repro")
    assert caught.value.one_line() == "kvtool repro needs PyTorch, which is not installed"
    assert caught.value.tip == (
        "pip install 'kvtool[repro]' (without a GPU, first the CPU-only wheel: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )


def _fake_package(tmp_path, monkeypatch, name: str, init: str) -> None:
    """``name`` installed as a package whose ``__init__`` is ``init`` (the real one unloaded for the test)."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(init)
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_dask_without_distributed_is_dask_not_installed(uninstalled, monkeypatch):
    uninstalled("distributed")  # dask installed, its distributed package not
    monkeypatch.delitem(sys.modules, "dask.distributed", raising=False)
    with pytest.raises(MissingExtraError) as caught:
        require("dask.distributed", feature="kvtool analyze --workers/--scheduler")
    # dask.distributed re-raises the ModuleNotFoundError as its own "dask.distributed is not installed"
    assert caught.value.one_line() == "kvtool analyze --workers/--scheduler needs Dask, which is not installed"
    assert caught.value.tip == "pip install 'kvtool[fleet]'"


def test_a_missing_dependency_of_the_extra_is_named(tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch, "fsspec", "import kvtool_no_such_dependency\n")
    with pytest.raises(MissingExtraError) as caught:
        require("fsspec", feature="kvtool analyze on a URL", where="s3://bucket/e.parquet")
    assert caught.value.one_line() == (
        "kvtool analyze on a URL needs fsspec, which is not installed "
        "(no module named 'kvtool_no_such_dependency') (s3://bucket/e.parquet)"
    )
    assert caught.value.tip == "pip install 'kvtool[fleet]'"


def test_an_installed_module_that_does_not_import_is_said_so(tmp_path, monkeypatch):
    # as torch does when a shared library of its CUDA build is missing: OSError at import
    _fake_package(tmp_path, monkeypatch, "msgpack", "raise OSError('libfoo.so.1: cannot open shared object file')\n")
    with pytest.raises(MissingExtraError) as caught:
        require("msgpack", feature="kvtool capture", where="--endpoint")
    assert caught.value.one_line() == (
        "kvtool capture needs msgpack, which is installed but does not import: "
        "libfoo.so.1: cannot open shared object file (--endpoint)"
    )
    assert caught.value.tip == "reinstall it: pip install 'kvtool[capture]'"


def test_require_returns_the_module_when_it_is_there():
    import msgpack  # installed by the dev extra

    assert require("msgpack", feature="kvtool capture") is msgpack
