"""kvtool: diagnostics and capacity planning for the KV cache of LLM inference."""

__version__ = "0.1.0"
