"""The kinds of layer an estimate tells apart (a ModelSpec's ``layer_kinds``), in a module of their own so that
hf_config and hybrid can both name them without importing each other."""

FULL = "full"
SLIDING = "sliding"
CHUNKED = "chunked"  # chunked local attention (Llama 4): attends within fixed chunks of attention_chunk_size tokens
MAMBA = "mamba"  # a state layer of a hybrid model: a fixed state per request (kvtool.estimate.hybrid)
