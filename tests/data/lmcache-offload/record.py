# LMCache's own LocalCPUBackend allocator, sized from the VllmConfig vLLM builds for a KV connector.
# Run: PYTHONPATH=<unpacked lmcache wheel>:<sortedcontainers> /work/vllm-venv/bin/python record.py
# For each (size, tp) it builds vLLM 0.32.0's VllmConfig of the tiny Llama (tests/data/estimate/tiny-llama) with the
# kv_transfer_config that vLLM 0.11.1-0.22.1's VllmConfig._post_init_kv_transfer_config sets for
# --kv-offloading-backend lmcache --kv-offloading-size SIZE (LMCacheConnectorV1, lmcache.local_cpu True,
# lmcache.max_local_cpu_size SIZE / (tp x pp)), applies it to LMCache's config as LMCacheConnectorV1Impl does,
# builds LMCache's metadata (VllmServiceFactory.get_or_create_metadata), constructs LocalCPUBackend and
# allocates one chunk's MemoryObj (metadata.get_shapes(), KV_2LTD) until the allocator returns None.
import json, logging, os, sys
from pathlib import Path

logging.disable(logging.WARNING)  # LMCache logs each failed allocation and each collected MemoryObj
import lmcache
from lmcache.integration.vllm import utils as lmc_utils
from lmcache.integration.vllm.vllm_service_factory import VllmServiceFactory
from lmcache.integration.vllm.vllm_v1_adapter import LMCacheConnectorV1Impl
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from vllm.engine.arg_utils import EngineArgs
import vllm

MODEL = str(Path(__file__).resolve().parents[1] / "estimate" / "tiny-llama")
rows = []
for size_gib, tp, chunk in ((0.01, 1, 256), (0.1, 1, 256), (0.01, 2, 256), (0.3, 1, 256), (0.01, 1, 96), (1.0, 2, 512), (0.01, 1, 10)):
    extra = {"lmcache.local_cpu": True, "lmcache.max_local_cpu_size": size_gib / tp, "lmcache.chunk_size": chunk}
    args = EngineArgs(model=MODEL, skip_tokenizer_init=True, block_size=32, max_model_len=2048, enforce_eager=True,
                      load_format="dummy", tensor_parallel_size=tp, distributed_executor_backend="mp",
                      kv_transfer_config={"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
                                          "kv_connector_extra_config": extra})
    vcfg = args.create_engine_config()
    lmc_utils._config_instance = None  # the singleton: a fresh LMCache config per row
    config = lmc_utils.lmcache_get_or_create_config()
    LMCacheConnectorV1Impl._apply_extra_config(None, config, vcfg)
    metadata = VllmServiceFactory(config, vcfg, "worker").get_or_create_metadata()  # as LMCacheManager does
    backend = LocalCPUBackend(config, metadata)
    shapes, dtypes = metadata.get_shapes(), metadata.get_dtypes()
    objs = []
    while (o := backend.memory_allocator.allocate(shapes, dtypes, MemoryFormat.KV_2LTD)) is not None:
        objs.append(o)
    rows.append({"kv_offloading_size_gib": size_gib, "tp": tp, "chunk_size": config.chunk_size,
                 "max_local_cpu_size_gb": config.max_local_cpu_size, "shapes": [list(s) for s in shapes],
                 "dtypes": [str(d) for d in dtypes], "bytes_per_chunk_allocated": objs[0].meta.phy_size,
                 "chunks_per_rank": len(objs), "allocator": type(backend.memory_allocator).__name__})
    print(json.dumps(rows[-1]), file=sys.stderr)
    for o in objs:
        backend.memory_allocator.free(o)
json.dump({"lmcache": lmcache.__version__ if hasattr(lmcache, "__version__") else os.environ.get("LMCACHE_VERSION"),
           "vllm": vllm.__version__, "rows": rows}, sys.stdout, indent=1)
print()
