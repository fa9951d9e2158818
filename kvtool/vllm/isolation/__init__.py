"""``kvtool vllm isolation``: whether a serving engine's prefix cache keeps tenants, adapters and prompt embeddings
apart.  ``check`` runs it (``run_isolation``) over ``plan`` (the probes), ``client`` (HTTP), ``engine`` (a vLLM it
starts), ``adapters`` (LoRA adapters it writes), ``record`` (what a run observed), ``verdicts`` (judging a record,
also a replayed one) and ``render``."""
