"""Hugging Face transformers models as --target: ``hf:DIR`` loading and a driver over the installed cache API.

kvtool calls the model as ``generate`` does: token ids, explicit ``position_ids``, the cache under the keyword
the installed version takes (``past_key_values``; ``cache_position`` too where the forward names it), and
``use_cache=True``.  The cache is a ``DynamicCache`` (``--hf-cache dynamic``; with the config's sliding window
its layers are sliding-window layers) or a ``StaticCache`` preallocated for the longest request
(``--hf-cache static``).  transformers is imported only here, and only for an HF target.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import torch

from kvtool.core.errors import InputFileError, UsageError
from kvtool.core.extras import require
from kvtool.core.jsonfile import read_json_object
from kvtool.repro.drivers import USER_ERRORS, Driver, Live, TargetFailure

HF_CACHES = ("dynamic", "static")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_hf_model(module: torch.nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(module, transformers.PreTrainedModel)


def _check_config_json(file: Path) -> None:
    """An empty, unreadable or non-JSON config.json is an input file error (exit 3) in kvtool's words; transformers
    said "OSError: It looks like the config file ... is not a valid JSON file" for an empty one, exit 2."""
    read_json_object(file)


def load_hf_dir(path: str, *, seed: int, dtype: torch.dtype) -> tuple[torch.nn.Module, str]:
    """A causal LM from a local folder: its weights when there are any, else random weights (seeded) from
    config.json alone.  Returns (model, how it was built)."""
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():  # a missing input file: exit 3, as estimate --config DIR
        raise InputFileError(f"no config.json in '{folder}'", where="--target", tip="hf:DIR names a local model folder")
    _check_config_json(folder / "config.json")
    require("transformers", feature="kvtool repro --target hf:DIR", where="--target")
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        if any((folder / name).is_file() for name in WEIGHT_FILES):
            model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
            return model, f"weights from {folder}"
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except USER_ERRORS as err:  # noqa: BLE001 - a broken config is the user's to fix
        raise UsageError(
            f"cannot build a causal LM from '{folder}': {type(err).__name__}: {' '.join(str(err).split())}",
            where="--target",
        ) from None
    return model, f"random weights (seed {seed}) from {folder / 'config.json'}"


class HfDriver(Driver):
    protocol = "hf"
    supports_batch = True

    def __init__(self, module: torch.nn.Module, hf_cache: str = "dynamic", max_tokens: int = 64):
        super().__init__(module)
        self.hf_cache, self.max_tokens = hf_cache, max_tokens
        params = inspect.signature(module.forward).parameters
        self.cache_keyword = (
            "past_key_values" if "past_key_values" in params or "past_key_value" not in params else "past_key_value"
        )
        self.takes_cache_position = "cache_position" in params

    def with_module(self, module: torch.nn.Module) -> Driver:
        return HfDriver(module, self.hf_cache, self.max_tokens)

    def begin(self, batch: int) -> Live:
        live = super().begin(batch)
        if live.cache is None:
            live.cache = self._new_cache(batch)
        return live

    def _new_cache(self, batch: int) -> Any:
        import transformers

        config: Any = self.module.config
        try:
            if self.hf_cache == "static":
                return transformers.StaticCache(config=config, max_cache_len=self.max_tokens)
            return transformers.DynamicCache(config=config)
        except TypeError:  # transformers 4.x signatures
            if self.hf_cache == "static":
                return transformers.StaticCache(
                    config=config, max_batch_size=batch, max_cache_len=self.max_tokens, dtype=self.module.dtype
                )
            return transformers.DynamicCache()

    def _kwargs(self, positions: torch.Tensor, cache: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"position_ids": positions, self.cache_keyword: cache, "use_cache": True}
        if self.takes_cache_position:
            kwargs["cache_position"] = positions[0]
        return kwargs

    def _call(self, inputs: torch.Tensor, positions: torch.Tensor, cache: Any, layers: bool) -> tuple[Any, Any, Any]:
        result = self.module(input_ids=inputs, output_hidden_states=layers, **self._kwargs(positions, cache))
        states = tuple(result.hidden_states or ()) if layers else ()
        return result.logits, cache, states  # the Cache object is updated in place

    def run_padded(self, prompts: list[torch.Tensor], decode: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Prompts of different lengths as one left-padded batch with an ``attention_mask`` (as ``generate``
        pads), then ``decode[i]`` [batch] token per step.  Per row: its prompt logits (pads cut), then one
        logits tensor per decode step, each [1, seq, vocab]."""
        live = self.begin(len(prompts))
        width = max(int(p.shape[0]) for p in prompts)
        device = prompts[0].device
        pads = [width - int(p.shape[0]) for p in prompts]
        ids = torch.stack([torch.cat([torch.zeros(n, dtype=p.dtype, device=device), p]) for n, p in zip(pads, prompts)])
        mask = (torch.arange(width, device=device)[None, :] >= torch.tensor(pads, device=device)[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        outs = [[row[None, n:]] for row, n in zip(self._padded_call(ids, mask, positions, live.cache), pads)]
        for tokens in decode:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            for row, logits in zip(outs, self._padded_call(tokens[:, None], mask, positions, live.cache)):
                row.append(logits[None])
        self.end(live)
        return outs

    def _padded_call(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        try:
            kwargs = self._kwargs(positions, cache)
            if self.takes_cache_position:
                kwargs["cache_position"] = torch.arange(mask.shape[1] - ids.shape[1], mask.shape[1], device=ids.device)
            result = self.module(input_ids=ids, attention_mask=mask, **kwargs)
        except USER_ERRORS as err:  # noqa: BLE001 - the target's exception is the finding
            raise TargetFailure(f"forward raised {type(err).__name__}: {' '.join(str(err).split())}") from None
        return result.logits.detach().clone()
