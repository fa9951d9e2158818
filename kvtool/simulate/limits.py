"""The largest values a request source may give (traces, distributions, options): one place, read by the trace
readers (``lengths``, ``workloads``) and the option checks."""

from __future__ import annotations

# The longest request length accepted (tokens), from a trace or a parameter: 10^9, a hundred times the longest
# context window of any released model, and low enough that a billion such requests still sum inside int64.
MAX_REQUEST_TOKENS = 1_000_000_000

# The largest arrival time accepted, in seconds from the trace's time 0 (about 31,700 years, as analyze's ts):
# an epoch in seconds or milliseconds fits, and arrival differences stay finite.
MAX_ARRIVAL_S = 1e12
