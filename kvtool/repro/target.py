"""`kvtool repro --target`: the isolation checks run against the user's own decoder.

A target is ``package.module:factory`` (the factory returns an ``nn.Module``; it may take ``device`` and
``dtype`` keywords) or ``hf:DIR`` (a local Hugging Face model folder: config.json, weights optional).  How the
module is called (its protocol) is in ``kvtool.repro.drivers``; how its cache is looked into in
``kvtool.repro.cachewalk``; the checks in ``kvtool.repro.target_checks``.

The checks run one after another; each result is handed to ``on_check`` as it finishes, and Ctrl-C ends the
run with the finished checks (``interrupted``).
"""

from __future__ import annotations

import contextlib
import copy
import glob
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvtool.core.errors import UsageError
from kvtool.repro import target_checks as tc
from kvtool.repro.cachewalk import weight_storages
from kvtool.repro.checks import DTYPES, TOLERANCES, path_tolerance
from kvtool.repro.drivers import PROTOCOL_ATTRIBUTE, Driver, TargetFailure, TokensDriver, vocab_size_of
from kvtool.repro.drivers import USER_ERRORS as _USER_ERRORS
from kvtool.repro.hf import HfDriver, is_hf_model
from kvtool.repro.results import TargetCheck, TargetResult
from kvtool.repro.workload import make_workload

CHECKS: tuple[tuple[str, Callable[[tc.Context], TargetCheck]], ...] = (
    ("determinism", tc.determinism),
    ("isolation", tc.isolation),
    ("consistency", tc.consistency),
    ("no-shared-storage", tc.no_shared_storage),
    ("no-aliasing", tc.no_aliasing),
    ("cache-length", tc.cache_length),
    ("batch", tc.batch),
)
CHECK_NAMES = tuple(name for name, _ in CHECKS)


@dataclass(frozen=True)
class LoadedTarget:
    module: torch.nn.Module
    factory: Callable[[], Any] | None  # None for hf:DIR
    built: str  # how the module was made
    notes: tuple[str, ...]  # e.g. the environment its package was found in


def _user_site_packages() -> list[str]:
    """site-packages of the environment the user has activated, when kvtool runs from another one (pipx)."""
    paths = []
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = os.environ.get(var)
        if prefix and os.path.realpath(prefix) != os.path.realpath(sys.prefix):
            pattern = os.path.join(prefix, "lib", "python*", "site-packages")
            paths += sorted(glob.glob(pattern)) + glob.glob(os.path.join(prefix, "Lib", "site-packages"))
    return [p for p in paths if p not in sys.path]


def _import(module_name: str, spec: str) -> tuple[Any, tuple[str, ...]]:
    """Import the target's module: the current directory first (as ``python -m`` and pytest do), then, if
    it is not found, the site-packages of the activated environment when kvtool runs from another one."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name), ()
    except ModuleNotFoundError as err:
        extra = _user_site_packages()
        if not extra:
            raise _import_error(module_name, spec, err) from None
        sys.path.extend(extra)
        try:
            module = importlib.import_module(module_name)
        except _USER_ERRORS as again:  # noqa: BLE001
            raise _import_error(module_name, spec, again) from None
        return module, (f"imported from the active environment ({', '.join(extra)}); kvtool runs in {sys.prefix}",)
    except _USER_ERRORS as err:  # noqa: BLE001 - any import-time failure is the target's fault
        raise _import_error(module_name, spec, err) from None


def _import_error(module_name: str, spec: str, err: BaseException) -> UsageError:
    tip = None
    if isinstance(err, ModuleNotFoundError) and (module_name.endswith(".py") or "/" in module_name):
        # a file path: importlib read it as a dotted name ('No module named /path/to/file')
        folder, file = os.path.split(module_name)
        attribute = spec.rsplit(":", 1)[1] if ":" in spec else "FACTORY"
        tip = (
            f"--target takes a module name, not a file path: cd {folder or '.'} && kvtool repro --target "
            f"{file.removesuffix('.py')}:{attribute}"
        )
    elif isinstance(err, ModuleNotFoundError):
        tip = (
            f"run kvtool with your environment's Python: python -m kvtool repro --target {spec} "
            "(or pip install kvtool into that environment)"
        )
    return UsageError(
        f"cannot import module '{module_name}' of target '{spec}': {type(err).__name__}: {err}",
        where="--target",
        tip=tip,
    )


def _call_factory(factory: Callable[..., Any], spec: str, device: str, dtype: torch.dtype) -> Any:
    """Call the factory, with ``device`` and ``dtype`` keywords where it takes them."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    kwargs: dict[str, Any] = {}
    if "device" in params:
        kwargs["device"] = torch.device(device)
    if "dtype" in params:
        kwargs["dtype"] = dtype
    try:
        return factory(**kwargs)
    except _USER_ERRORS as err:  # noqa: BLE001
        raise UsageError(f"factory of target '{spec}' raised {type(err).__name__}: {err}", where="--target") from None


def load_target(spec: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> LoadedTarget:
    """Import ``package.module:factory`` and call it, or build ``hf:DIR``; UsageError names the target."""
    if spec.startswith("hf:"):
        from kvtool.repro.hf import load_hf_dir

        model, built = load_hf_dir(spec[3:], seed=seed, dtype=DTYPES[dtype])
        return LoadedTarget(model, None, built, ())
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--target must look like package.module:factory or hf:DIR, got '{spec}'", where="--target")
    obj, notes = _import(module_name, spec)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"target '{spec}': '{module_name}' has no attribute '{attr}'", where="--target")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(
            f"target '{spec}' is not callable (it is of type {type(obj).__name__}); name a factory", where="--target"
        )
    factory = obj
    module = _call_factory(factory, spec, device, DTYPES[dtype])
    if not isinstance(module, torch.nn.Module):
        raise UsageError(
            f"factory of target '{spec}' returned {type(module).__name__}, expected a torch.nn.Module",
            where="--target",
        )
    return LoadedTarget(module, lambda: _call_factory(factory, spec, device, DTYPES[dtype]), f"{spec}()", notes)


def check_target(
    spec: str,
    *,
    d_model: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    interleavings: int = 20,
    hf_cache: str | None = None,
    on_check: Callable[[TargetCheck], None] | None = None,
) -> TargetResult:
    """Load the target and run the checks; UsageError if it cannot be loaded or its inputs cannot be told.

    Whatever the target's own code prints (the article's habit: print each cache's shape and data_ptr
    on every step) goes to stderr, so stdout carries only kvtool's answer and ``--json`` stays JSON.
    """
    stdout = sys.stdout

    def report(check: TargetCheck) -> None:
        if on_check is not None:
            with contextlib.redirect_stdout(stdout):  # kvtool's own stream, not the target's
                on_check(check)

    with contextlib.redirect_stdout(sys.stderr):
        setup = _prepare(spec, d_model=d_model, device=device, dtype=dtype, seed=seed, hf_cache=hf_cache)
        setup.ctx.interleavings = interleavings
        checks, interrupted = _run_checks(setup.ctx, report)
    failed = tuple(c.name for c in checks if not c.passed)
    return TargetResult(
        target=spec,
        module_type=type(setup.ctx.driver.module).__name__,
        d_model=setup.d_model,
        passed=not failed and not interrupted,
        checks=tuple(checks),
        failed_checks=failed,
        protocol=setup.ctx.driver.protocol,
        vocab_size=setup.vocab_size,
        built=setup.built,
        workload=setup.ctx.work.describe(),
        cache_notes=setup.notes + _cache_notes(setup.ctx),
        interrupted=interrupted,
    )


def _run_checks(ctx: tc.Context, on_check: Callable[[TargetCheck], None]) -> tuple[list[TargetCheck], bool]:
    """Each check in turn (a failure inside one fails that one); Ctrl-C stops with the finished ones."""
    done: list[TargetCheck] = []
    try:
        with torch.inference_mode():
            for name, check in CHECKS:
                start = time.perf_counter()
                try:
                    result = check(ctx)
                except TargetFailure as err:
                    result = TargetCheck(name, False, str(err), ())
                result = replace(result, elapsed_s=round(time.perf_counter() - start, 3))
                done.append(result)
                on_check(result)
    except KeyboardInterrupt:
        return done, True
    return done, False


@dataclass
class _Setup:
    ctx: tc.Context
    d_model: int | None
    vocab_size: int | None
    built: str
    notes: tuple[str, ...]


def _inputs_of(
    module: torch.nn.Module, driver: Driver, spec: str, d_model: int | None
) -> tuple[int | None, int | None]:
    """(d_model, vocab): what the workload is made of, random vectors or random token ids."""
    if driver.protocol != "embeds":
        vocab = vocab_size_of(module)
        if vocab is None:
            raise UsageError(
                f"cannot tell the vocabulary size of target '{spec}': no vocab_size attribute, no config.vocab_size, "
                "no nn.Embedding",
                where="--target",
                tip="give the module a vocab_size attribute",
            )
        return None, vocab
    if d_model is None:
        d_model = getattr(module, "d_model", None)
        if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model <= 0:
            raise UsageError(
                f"cannot tell d_model of target '{spec}': the module has no positive integer d_model attribute",
                where="--target",
                tip="pass --d-model N",
            )
    return d_model, None


def _fresh_maker(module: torch.nn.Module, loaded: LoadedTarget, driver: Driver, dev, dtype) -> Callable[[], Driver]:
    """Fresh copies with the same weights: a deepcopy of the module as built, else a new one from the factory."""
    try:
        pristine: torch.nn.Module | None = copy.deepcopy(module)
    except _USER_ERRORS:  # noqa: BLE001 - fall back to a new instance with the same weights
        pristine = None
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def fresh() -> Driver:
        try:
            if pristine is not None:
                return driver.with_module(copy.deepcopy(pristine))
            if loaded.factory is None:
                raise TargetFailure("the model cannot be copied (copy.deepcopy failed)")
            other = loaded.factory().to(device=dev, dtype=dtype).eval()
            other.load_state_dict(state)
            return driver.with_module(other)
        except _USER_ERRORS as err:  # noqa: BLE001
            raise TargetFailure(f"could not make a fresh copy of the module: {type(err).__name__}: {err}") from None

    return fresh


def make_driver(module: torch.nn.Module, hf_cache: str, max_tokens: int) -> Driver:
    """The driver for ``module``'s protocol: HF when it is a PreTrainedModel, else its ``kvtool_protocol``."""
    if is_hf_model(module):
        return HfDriver(module, hf_cache, max_tokens)
    protocol = getattr(module, PROTOCOL_ATTRIBUTE, "embeds")
    if protocol not in ("tokens", "embeds"):  # a typo ('token') was driven as embeds, silently
        raise UsageError(
            f"{type(module).__name__}.{PROTOCOL_ATTRIBUTE} is {protocol!r}; kvtool knows 'tokens' and 'embeds'",
            where="--target",
            tip="see docs/repro.md, 'How kvtool calls it (protocols)'",
        )
    if protocol == "tokens":
        return TokensDriver(module)
    return Driver(module)


def _declared_window(module: torch.nn.Module) -> int | None:
    for owner in (module, getattr(module, "config", None)):
        window = getattr(owner, "sliding_window", None)
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            return window
    return None


def _prepare(spec: str, *, d_model: int | None, device: str, dtype: str, seed: int, hf_cache: str | None) -> _Setup:
    loaded = load_target(spec, device=device, dtype=dtype, seed=seed)
    dev, torch_dtype = torch.device(device), DTYPES[dtype]
    try:
        module = loaded.module.to(device=dev, dtype=torch_dtype).eval()
    except _USER_ERRORS as err:  # noqa: BLE001
        raise UsageError(f"cannot move target '{spec}' to {device}/{dtype}: {err}", where="--target") from None
    if hf_cache is not None and not is_hf_model(module):
        raise UsageError(
            f"--hf-cache applies to transformers models; target '{spec}' is a {type(module).__name__}",
            where="--hf-cache",
            tip="drop --hf-cache: kvtool uses the cache the module makes",
        )
    hf_cache = hf_cache or "dynamic"
    probe = make_driver(module, hf_cache, 1)
    option = "--d-model" if d_model is not None else "--target"  # where a d_model too large for memory came from
    d_model, vocab = _inputs_of(module, probe, spec, d_model)
    try:
        work = make_workload(seed, d_model=d_model, vocab=vocab, dtype=torch_dtype, device=dev)
    except (RuntimeError, MemoryError) as err:  # d_model 10**12: the allocator's error was a traceback
        raise UsageError(
            f"cannot make the inputs of target '{spec}' (d_model {d_model}): {type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}",
            where=option,
        ) from None
    driver = make_driver(module, hf_cache, work.max_tokens)
    ctx = tc.Context(
        driver=driver,
        fresh=_fresh_maker(module, loaded, driver, dev, torch_dtype),
        work=work,
        tol=TOLERANCES[dtype],
        path_tol=path_tolerance(dtype, _num_layers(module)),
        weights=weight_storages(module),
        window=_declared_window(module),
        seed=seed,
        interleavings=0,
    )
    return _Setup(ctx, d_model, vocab, loaded.built, loaded.notes)


def _num_layers(module: torch.nn.Module) -> int:
    """Decoder depth: the config's num_hidden_layers (transformers), else the longest ModuleList; 1 if unknown."""
    layers = getattr(getattr(module, "config", None), "num_hidden_layers", None)
    if isinstance(layers, int) and layers > 0:
        return layers
    lists = [len(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, default=1) or 1


def _cache_notes(ctx: tc.Context) -> tuple[str, ...]:
    """What a request's cache held at the end of the round-robin run, and what was skipped and why."""
    rr = ctx.round_robin
    if rr is None or not rr.scans:
        return ()
    scan = rr.scans[min(rr.scans)]
    shown = ", ".join(f"{t.path} {list(t.tensor.shape)}" for t in scan.tensors[:4])
    more = f" and {len(scan.tensors) - 4} more" if len(scan.tensors) > 4 else ""
    notes = [f"r0's cache: {len(scan.tensors)} tensor(s): {shown}{more}" if scan.tensors else "r0's cache: no tensors"]
    reasons: dict[str, list[str]] = {}
    for item in scan.skipped:
        reasons.setdefault(item.reason, []).append(item.path)
    for reason, paths in reasons.items():
        extra = f" and {len(paths) - 2} more" if len(paths) > 2 else ""
        notes.append(f"skipped {', '.join(paths[:2])}{extra}: {reason}")
    return tuple(notes)
