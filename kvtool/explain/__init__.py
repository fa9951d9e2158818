"""``kvtool explain``: a vLLM start-up log read, each of its figures reproduced with the version's rules, and
what-ifs calibrated on it (parse -> settings -> reproduce -> whatif; explain.explain_log is the straight pass)."""
