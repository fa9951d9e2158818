"""The cache-object protocol of `kvtool repro --target`: find the tensors a request's cache holds.

A cache may be any nesting of tensors, tuples, lists, dicts and objects (their attributes and ``__slots__``),
``nn.Module`` caches (their buffers, parameters and tensor attributes: a gpt-fast or litgpt ``KVCache``),
Hugging Face ``Cache`` objects (``DynamicCache``, ``StaticCache``, sliding-window layers: their ``layers`` with
``keys``/``values`` and ``get_seq_length()``), or an object that reports itself through two optional methods:

- ``kvtool_tensors()`` -> a mapping name -> tensor: the tensors that make up the cache (laid out
  ``[..., seq, head_dim]``: the sequence is dimension -2);
- ``kvtool_valid_length()`` -> int: how many tokens the cache holds (its valid region along dimension -2).

What is not looked into is reported (``Skipped``) with the reason: Python modules and functions (shared by
design), the target's own weights, plain numbers and strings.  An object met twice is visited once; the second
path is recorded as an alias of the first (``[KVCache(...)] * n_layer`` gives every layer the same object).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

CACHE_TENSORS_METHOD = "kvtool_tensors"
VALID_LENGTH_METHOD = "kvtool_valid_length"


@dataclass(frozen=True)
class CacheTensor:
    path: str  # "cache[0].k_cache", "cache.layers[1].keys"
    tensor: torch.Tensor
    valid_length: int | None  # tokens the cache says it holds (get_seq_length, kvtool_valid_length); None: unknown
    window: int | None  # the most tokens the cache keeps (a sliding window), when the cache says so


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str  # "an int", "a Python module (shared by design)", "the target's weights (shared by design)"


@dataclass(frozen=True)
class Alias:
    path: str
    same_as: str  # the path where the same object was met first


@dataclass(frozen=True)
class CacheScan:
    tensors: tuple[CacheTensor, ...]
    skipped: tuple[Skipped, ...]
    aliases: tuple[Alias, ...]  # the same object (holding tensors) reached by two paths


@dataclass
class _Walk:
    weights: set[int]  # storage addresses of the target's parameters
    tensors: list[CacheTensor] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    aliases: list[Alias] = field(default_factory=list)
    first_path: dict[int, str] = field(default_factory=dict)  # id(object) -> where it was met first
    depth: int = 0  # nesting of the object being visited


# Deeper nesting is skipped and said: a cache nested thousands of lists deep was a RecursionError traceback.
MAX_DEPTH = 64


def scan_cache(cache: Any, weights: set[int] | None = None, root: str = "cache") -> CacheScan:
    """Every tensor of ``cache`` with its path; ``weights``: storage addresses of the target's parameters."""
    walk = _Walk(weights or set())
    _visit(cache, root, walk, None)
    return CacheScan(tuple(walk.tensors), tuple(walk.skipped), tuple(walk.aliases))


def weight_storages(module: torch.nn.Module) -> set[int]:
    """Storage addresses of a module's parameters: weights are shared by every request by design."""
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


_PLAIN = (str, bytes, int, float, bool, complex)


def _visit(obj: Any, path: str, walk: _Walk, window: int | None) -> None:
    if walk.depth >= MAX_DEPTH:
        walk.skipped.append(Skipped(path, f"nested deeper than {MAX_DEPTH} levels"))
        return
    walk.depth += 1
    try:
        _visit_one(obj, path, walk, window)
    finally:
        walk.depth -= 1


def _visit_one(obj: Any, path: str, walk: _Walk, window: int | None) -> None:
    if obj is None:
        return
    if isinstance(obj, _PLAIN):
        name = type(obj).__name__
        walk.skipped.append(Skipped(path, f"{'an' if name[0] in 'aeiou' else 'a'} {name}"))
        return
    if id(obj) in walk.first_path:
        walk.aliases.append(Alias(path, walk.first_path[id(obj)]))
        return
    walk.first_path[id(obj)] = path
    if isinstance(obj, torch.Tensor):
        _add_tensor(obj, path, walk, None, window)
    elif isinstance(obj, types.ModuleType):
        walk.skipped.append(Skipped(path, "a Python module (shared by design)"))
    elif isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)):
        walk.skipped.append(Skipped(path, "a function or class"))
    elif callable(getattr(obj, CACHE_TENSORS_METHOD, None)):
        _visit_reporting(obj, path, walk)
    elif _is_hf_cache(obj):
        _visit_hf(obj, path, walk)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _visit(value, f"{path}[{key!r}]", walk, window)
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            _visit(value, f"{path}[{i}]", walk, window)
    elif isinstance(obj, torch.nn.Module):
        _visit_module(obj, path, walk)
    else:
        for name, value in _attributes(obj).items():
            _visit(value, f"{path}.{name}", walk, window)


def _add_tensor(t: torch.Tensor, path: str, walk: _Walk, valid: int | None, window: int | None) -> None:
    if isinstance(t, torch.nn.Parameter) and t.untyped_storage().data_ptr() in walk.weights:
        walk.skipped.append(Skipped(path, "the target's weights (shared by design)"))
        return
    walk.tensors.append(CacheTensor(path, t, valid, window))


def _attributes(obj: Any) -> dict[str, Any]:
    attributes = dict(getattr(obj, "__dict__", None) or {})
    for klass in type(obj).__mro__:  # a class with __slots__ has no __dict__
        slots = klass.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if hasattr(obj, name):
                attributes.setdefault(name, getattr(obj, name))
    return attributes


def _visit_module(module: torch.nn.Module, path: str, walk: _Walk) -> None:
    """A cache held in an nn.Module: its buffers, parameters and plain tensor attributes, submodules included."""
    for prefix, sub in module.named_modules(remove_duplicate=False):
        where = f"{path}.{prefix}" if prefix else path
        if sub is not module and id(sub) in walk.first_path:
            walk.aliases.append(Alias(where, walk.first_path[id(sub)]))
            continue
        walk.first_path.setdefault(id(sub), where)
        reporting = callable(getattr(sub, CACHE_TENSORS_METHOD, None))
        if reporting and sub is not module:
            _visit_reporting(sub, where, walk)
            continue
        named = {**sub._parameters, **sub._buffers}
        named.update({k: v for k, v in vars(sub).items() if isinstance(v, torch.Tensor)})
        for name, value in named.items():
            if value is None:
                continue
            if id(value) in walk.first_path:
                walk.aliases.append(Alias(f"{where}.{name}", walk.first_path[id(value)]))
                continue
            walk.first_path[id(value)] = f"{where}.{name}"
            _add_tensor(value, f"{where}.{name}", walk, None, None)
        for name, value in vars(sub).items():  # lists and objects held by the module (per-head caches, say)
            if not name.startswith("_") and isinstance(value, (list, tuple, dict)) and value:
                _visit(value, f"{where}.{name}", walk, None)


def _visit_reporting(obj: Any, path: str, walk: _Walk) -> None:
    """An object with ``kvtool_tensors()`` (and maybe ``kvtool_valid_length()``): trust its report."""
    tensors = getattr(obj, CACHE_TENSORS_METHOD)()
    valid_fn = getattr(obj, VALID_LENGTH_METHOD, None)
    valid = int(valid_fn()) if callable(valid_fn) else None
    items = tensors.items() if isinstance(tensors, dict) else enumerate(tensors)
    for name, t in items:
        if isinstance(t, torch.Tensor):
            if id(t) in walk.first_path:
                walk.aliases.append(Alias(f"{path}.{name}", walk.first_path[id(t)]))
                continue
            walk.first_path[id(t)] = f"{path}.{name}"
            _add_tensor(t, f"{path}.{name}", walk, valid, None)


def _is_hf_cache(obj: Any) -> bool:
    """A Hugging Face transformers ``Cache`` (5.x: ``layers`` of keys/values; 4.x: ``key_cache`` lists)."""
    return callable(getattr(obj, "get_seq_length", None)) and (
        isinstance(getattr(obj, "layers", None), list) or isinstance(getattr(obj, "key_cache", None), list)
    )


def _visit_hf(cache: Any, path: str, walk: _Walk) -> None:
    """A transformers Cache: each layer's keys and values, its valid length and its window."""
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        for i, layer in enumerate(layers):
            where = f"{path}.layers[{i}]"
            if id(layer) in walk.first_path:
                walk.aliases.append(Alias(where, walk.first_path[id(layer)]))
                continue
            walk.first_path[id(layer)] = where
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
                walk.skipped.append(Skipped(where, "a layer not filled yet"))
                continue
            valid = int(layer.get_seq_length()) if callable(getattr(layer, "get_seq_length", None)) else None
            window = _hf_window(layer)
            _add_tensor(keys, f"{where}.keys", walk, valid, window)
            _add_tensor(values, f"{where}.values", walk, valid, window)
        return
    for name in ("key_cache", "value_cache"):  # transformers 4.x
        for i, t in enumerate(getattr(cache, name, []) or []):
            if isinstance(t, torch.Tensor) and t.numel():
                _add_tensor(t, f"{path}.{name}[{i}]", walk, int(cache.get_seq_length(i)), None)


def _hf_window(layer: Any) -> int | None:
    if not getattr(layer, "is_sliding", False):
        return None
    window = getattr(layer, "sliding_window", None) or getattr(layer, "max_cache_len", None)
    return int(window) if isinstance(window, int) else None
