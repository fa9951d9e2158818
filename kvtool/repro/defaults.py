"""How many seeded interleavings `kvtool repro` runs: its defaults and its maximum.

Torch-free, so the command's --help states them without loading torch (``kvtool.repro.run`` applies them).
"""

from __future__ import annotations

SCENARIO_INTERLEAVINGS = 200  # default --interleavings for the built-in scenarios
TARGET_INTERLEAVINGS = 10  # for a --target: a real decoder's forward costs ~10 ms on CPU, and 10 orders of 6
# requests already interleave every pair of requests many times (a default run stays under 30 s)
# The most --interleavings accepted: 50 times the scenarios' default.  An interleaving of the seven scenarios costs
# about 19 ms (buggy and fixed, 2-core CPU), so the largest run takes minutes, where 10**12 would run for some 600
# years.  More orders: run again with another --seed.
MAX_INTERLEAVINGS = 10_000
