"""SGLang engine models for `kvtool simulate`: its radix cache (radix_cache) and its scheduler (scheduler)."""
