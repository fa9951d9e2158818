"""``kvtool estimate --engine sglang``: SGLang's KV pool (mem_fraction_static, max_total_num_tokens) read from its
source, release by release (kvtool.estimate.sglang.versions), beside vLLM's."""
