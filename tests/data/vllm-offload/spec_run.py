# vLLM 0.32.0's own CPUOffloadingSpec.__init__, fed the OffloadingConfig the failed engine built (one worker, the tiny
# Llama's 4 layers x 8,192 B page at block 32, blocks_per_chunk 1).
import dataclasses, sys
from vllm.v1.kv_offload.config import *
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
fields = {f.name for f in dataclasses.fields(OffloadingParallelConfig)}
par = OffloadingParallelConfig(**{n: (False if n == "is_parallelism_agnostic" else None if n == "data_parallel_rank_local" else (0 if n in ("rank", "data_parallel_index") else 1)) for n in fields})
for size_gib, tp in ((0.01, 1), (1.0, 1), (0.01, 2), (0.3, 1)):
    par2 = dataclasses.replace(par, world_size=tp, tp_size=tp)
    per_worker = 4 * 32 * 2 * (2 // tp) * 32 * 2  # layers x block x K,V x kv heads per rank x head_dim x bf16
    cfg = OffloadingConfig(groups=(OffloadingGroupConfig(32, ("l0","l1","l2","l3"), 0),), worker_kv_bytes_per_block=per_worker,
        enable_kv_cache_events=False, extra_config={"cpu_bytes_to_use": size_gib * (1 << 30)}, engine_id="e",
        model=OffloadingModelConfig("tiny", "bfloat16"), cache=OffloadingCacheConfig(32, 1), parallel=par2)
    s = CPUOffloadingSpec(cfg)
    print(f"kv_offloading_size={size_gib} tp={tp} worker_kv_bytes_per_block={per_worker} kv_bytes_per_chunk={s.kv_bytes_per_chunk} num_chunks={s.num_chunks}")
