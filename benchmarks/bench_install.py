"""The small install (issue 24): what `pip install kvtool` pulls from plain PyPI, and how long from the start of the
install to the first answer of `kvtool estimate --model llama-3.1-8b --gpu L4`.

A fresh machine with only PyPI, simulated in a temporary directory:

1. a fresh venv (``python -m venv``, with the pip its Python bundles), timed apart: a new machine has its Python;
2. ``pip install --dry-run --report report.json PROJECT`` against PyPI alone: ``--isolated``, ``PIP_CONFIG_FILE``
   set to /dev/null and no ``PIP_*`` variable (this machine's wheel folders, local indexes and constraints, which
   ``pip config list`` shows, would otherwise hide what PyPI pulls), ``--index-url https://pypi.org/simple`` and an
   empty cache; the report must name no torch, no ``nvidia-*`` and no triton package (exit 1 if it does);
3. the real install, in a second fresh venv with a second empty cache so nothing of step 2 is reused: the wheel of
   the checkout (built first, untimed, as PyPI would serve it: what ``pip install kvtool`` installs), or with
   ``--from-source`` the checkout itself (``pip install PROJECT``, not editable: pip builds the wheel, compiler
   included, inside the timed run); then the venv's own ``kvtool estimate ...`` run from the temporary directory
   (so nothing is imported from the checkout).  The time runs from the start of pip to the end of estimate's
   answer; the aim is under 10 s.  pip byte-compiles every module it installs (its default), which is most of it.

Run from the repository root (pip must reach pypi.org):  python benchmarks/bench_install.py [--project PATH]
[--dry-run-only] [--from-source] [--upgrade-pip] [--keep].  ``--upgrade-pip`` first (untimed) upgrades the pip the
venv bundles (Python 3.11.7's: 23.2.1) to PyPI's newest.  ``--project`` points at another checkout (the main branch before issue 24 pulled torch
and the CUDA packages; ``--dry-run-only`` shows it without installing them).  Prints the figures the README
"Performance" section quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/simple"
ESTIMATE = ["estimate", "--model", "llama-3.1-8b", "--gpu", "L4"]
AIM_S = 10.0
GPU_PACKAGE = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")  # torch's CUDA build and what it pulls


@dataclass(frozen=True)
class DryRun:
    packages: tuple[tuple[str, str], ...]  # (name, version) of everything pip would install, kvtool included
    gpu_packages: tuple[str, ...]  # of those, torch / triton / nvidia-* / cuda-*
    seconds: float


@dataclass(frozen=True)
class RealInstall:
    pip_s: float  # pip install PROJECT, from its start to its exit
    pip_cpu_s: float  # its user + system CPU time (steadier than wall time on a shared machine)
    estimate_s: float  # then kvtool estimate, to the end of its answer
    site_packages_mb: float  # what the install takes on disk
    estimate_first_line: str
    imports_torch_or_matplotlib: bool  # whether either is importable in the new venv (it must not be)

    @property
    def total_s(self) -> float:
        return self.pip_s + self.estimate_s


def pypi_only_env() -> dict[str, str]:
    """This environment without any pip setting: no PIP_* variable and no config file (pip reads PIP_CONFIG_FILE
    even with --isolated, which ignores the other variables; the cache is given as --cache-dir for that reason)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull)
    return env


def make_venv(folder: Path) -> tuple[Path, float]:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    return folder / "bin" / "python", time.perf_counter() - start


def pip(python: Path, args: list[str], cwd: Path, cache: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` against PyPI alone, with its own empty cache (or none)."""
    cached = ["--cache-dir", str(cache)] if cache is not None else ["--no-cache-dir"]
    cmd = [str(python), "-m", "pip", *args[:1], "--isolated", *cached, *args[1:]]
    return subprocess.run(cmd, env=pypi_only_env(), cwd=cwd, capture_output=True, text=True)


def pip_settings(python: Path, cwd: Path) -> str:
    """``pip config list`` as the runs see it (empty: nothing of this machine's pip configuration applies)."""
    return pip(python, ["config", "list"], cwd).stdout.strip()


def fresh_venv(folder: Path, upgrade_pip: bool) -> tuple[Path, float, str]:
    """(its python, seconds to make it, its pip's version)."""
    python, seconds = make_venv(folder)
    if upgrade_pip:
        pip(python, ["install", "--quiet", "--index-url", PYPI, "--upgrade", "pip"], folder)
    return python, seconds, pip(python, ["--version"], folder).stdout.split()[1]


def build_wheel(python: Path, project: Path, work: Path) -> Path:
    """The wheel of the checkout (what PyPI would serve for `pip install kvtool`), built apart."""
    dist = work / "dist"
    proc = pip(python, ["wheel", "--quiet", "--no-deps", "--index-url", PYPI, "-w", str(dist), str(project)], work)
    if proc.returncode != 0:
        sys.exit(f"pip wheel failed:\n{proc.stderr}")
    return next(dist.glob("kvtool-*.whl"))


def dry_run(python: Path, project: Path, work: Path) -> DryRun:
    report = work / "report.json"
    start = time.perf_counter()
    proc = pip(
        python,
        ["install", "--dry-run", "--quiet", "--index-url", PYPI, "--report", str(report), str(project)],
        work,
        cache=work / "cache-dry-run",
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"pip install --dry-run failed:\n{proc.stderr}")
    install = json.loads(report.read_text())["install"]
    packages = tuple(sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in install))
    gpu = tuple(name for name, _ in packages if GPU_PACKAGE.match(name.lower()))
    return DryRun(packages, gpu, seconds)


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def real_install(python: Path, what: Path, work: Path) -> RealInstall:
    """``pip install WHAT`` (a wheel or the checkout), then the first estimate, timed."""
    env = pypi_only_env()
    kvtool = python.parent / "kvtool"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = pip(python, ["install", "--quiet", "--index-url", PYPI, str(what)], work, cache=work / "cache-install")
    installed = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"pip install failed:\n{proc.stderr}")
    answer = subprocess.run([str(kvtool), *ESTIMATE], env=env, cwd=work, capture_output=True, text=True)
    done = time.perf_counter()
    if answer.returncode != 0 or not answer.stdout.strip():
        sys.exit(f"kvtool estimate failed (exit {answer.returncode}):\n{answer.stderr}")
    probe = "import importlib.util as u; print(any(u.find_spec(m) for m in ('torch', 'matplotlib')))"
    heavy = subprocess.run([str(python), "-c", probe], env=env, cwd=work, capture_output=True, text=True, check=True)
    site = next((python.parent.parent / "lib").glob("python*/site-packages"))
    return RealInstall(
        pip_s=installed - start,
        pip_cpu_s=after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
        estimate_s=done - installed,
        site_packages_mb=folder_mb(site),
        estimate_first_line=answer.stdout.strip().splitlines()[0],
        imports_torch_or_matplotlib=heavy.stdout.strip() == "True",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="the checkout to install (default: this one)")
    parser.add_argument("--dry-run-only", action="store_true", help="only resolve the dependency set")
    parser.add_argument("--from-source", action="store_true", help="time pip install PROJECT (builds the wheel)")
    parser.add_argument("--upgrade-pip", action="store_true", help="upgrade the venv's bundled pip first")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    project = args.project.resolve()
    work = Path(tempfile.mkdtemp(prefix="kvtool-install-"))
    try:
        python, venv_s, version = fresh_venv(work / "venv", args.upgrade_pip)
        settings = pip_settings(python, work)
        print(f"project {project}; fresh venv in {venv_s:.1f} s (pip {version}); PyPI only: {PYPI}")
        print(f"pip config list in the runs: {settings or '(empty)'}")
        if settings:
            sys.exit("a pip setting of this machine still applies: the runs would not see plain PyPI")
        plan = dry_run(python, project, work)
        names = ", ".join(f"{n} {v}" for n, v in plan.packages)
        print(f"dry run ({plan.seconds:.1f} s): {len(plan.packages)} packages: {names}")
        if plan.gpu_packages:
            print(f"FAIL: pip install pulls GPU packages from PyPI: {', '.join(plan.gpu_packages)}")
            return 1
        print("no torch, triton, nvidia-* or cuda-* package")
        if args.dry_run_only:
            return 0
        what = project if args.from_source else build_wheel(python, project, work)
        python, _, _ = fresh_venv(work / "venv-install", args.upgrade_pip)
        run = real_install(python, what, work)
        print(
            f"pip install {what.name}: {run.pip_s:.1f} s wall, {run.pip_cpu_s:.1f} s CPU "
            f"({run.site_packages_mb:.0f} MB in site-packages, pip included); then kvtool {' '.join(ESTIMATE)}: {run.estimate_s:.2f} s"
        )
        print(f"  its first line: {run.estimate_first_line}")
        print(f"  torch or matplotlib importable in the new venv: {'yes' if run.imports_torch_or_matplotlib else 'no'}")
        verdict = "met" if run.total_s < AIM_S else "missed"
        print(f"from the start of the install to the answer: {run.total_s:.1f} s (aim < {AIM_S:.0f} s: {verdict})")
        return 0 if run.total_s < AIM_S and not run.imports_torch_or_matplotlib else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
