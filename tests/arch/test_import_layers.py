"""The import contract of the package layout (docs/architecture.md): imports flow one way.

    kvtool.cli  ->  kvtool.simulate  ->  kvtool.{estimate, events, vllm, repro}  ->  kvtool.core

Every import counts, also those inside functions (they are how heavy modules stay lazy, and a cycle through them is
still a cycle). Renderers (``*/render.py``, ``*/plots.py``) are imported only by the CLI and by other renderers.
The rules are checked on the source with ``ast``, so a new module is covered without being listed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO_ROOT

PACKAGE = REPO_ROOT / "kvtool"

# package -> the kvtool packages it may import (besides itself).  The top-level kvtool/__init__.py and
# kvtool/__main__.py are "kvtool".
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "estimate": {"core"},
    "repro": {"core"},
    "events": {"core"},
    "vllm": {"core", "events"},
    "simulate": {"core", "estimate", "events", "vllm"},
    "api": {"core", "estimate", "events", "vllm", "simulate", "repro"},
    "explain": {"core", "estimate"},
    "plan": {"core", "estimate", "simulate"},
    "watch": {"core", "events", "vllm"},
    "cli": {"core", "estimate", "events", "vllm", "simulate", "repro", "api", "kvtool", "explain", "plan", "watch"},
    "kvtool": {"cli", "api", "core"},
}
RENDERERS = ("render", "plots")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str | None = None) -> set[str]:
    """Every kvtool module named by an import statement in the file (absolute or relative)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = (module or _module_name(path)).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "kvtool")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "kvtool":
                continue
            found.add(base)
            for alias in node.names:  # `from kvtool.events import plots` names a module
                if (PACKAGE.parent / Path(*base.split("."), alias.name)).with_suffix(".py").exists():
                    found.add(f"{base}.{alias.name}")
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "kvtool"


def test_packages_import_only_the_layers_below_them():
    graph = _graph()
    assert len(graph) > 30  # the walk found the package
    wrong = []
    for module, targets in graph.items():
        pkg = _package(module)
        for target in targets:
            other = _package(target)
            if other != pkg and other not in ALLOWED[pkg]:
                wrong.append(f"{module} imports {target} ({pkg} may import {sorted(ALLOWED[pkg]) or 'nothing'})")
    assert not wrong, "\n".join(wrong)


def test_only_the_cli_and_renderers_import_renderers():
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if target.rsplit(".", 1)[-1] in RENDERERS
        and _package(module) != "cli"
        and module.rsplit(".", 1)[-1] not in RENDERERS
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = _graph()
    modules = set(graph)
    edges = {m: {t for t in ts if t in modules and t != m} for m, ts in graph.items()}
    # a package's __init__ importing its own submodules is not a cycle worth reporting; everything else is
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_contract_catches_a_violation(tmp_path):
    """The checker itself: an upward import and a cycle in a scratch tree are found (a test that can fail)."""
    src = tmp_path / "mod.py"
    src.write_text("from kvtool.cli.output import print_json\n\ndef f():\n    from ..simulate import render\n")
    found = _imports(src, "kvtool.events.mod")
    assert found == {"kvtool.cli.output", "kvtool.simulate", "kvtool.simulate.render"}
    assert {_package(t) for t in found} - ALLOWED["events"] == {"cli", "simulate"}
