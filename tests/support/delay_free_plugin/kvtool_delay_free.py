"""A deliberately slow vLLM: a general plugin that delays each finished request's KV-block free.

The planted fault of the watch live test (tests/watch/test_watch_live.py): the seed article's case, where the free
path waited synchronously for a statistics report, so blocks came back 800 ms after their request finished.  Never
install it: the test puts this folder on the engine's PYTHONPATH, where vLLM finds the ``vllm.general_plugins``
entry point beside it and calls :func:`register` in every vLLM process (the engine core's first statement).

While the file named by ``KVTOOL_TEST_DELAY_FREE_FLAG`` exists, ``Scheduler._free_blocks`` (vllm/v1/core/sched/
scheduler.py, 0.32: called by ``_free_request`` once the request is finished, before ``KVCacheManager.free``)
sleeps ``KVTOOL_TEST_DELAY_FREE_MS`` (default 300) first.  kvtool's recorder measures exactly that span as the
free's ``latency_ms``.  Unset: the plugin does nothing.
"""

from __future__ import annotations

import os
import time


def register() -> None:
    flag = os.environ.get("KVTOOL_TEST_DELAY_FREE_FLAG", "")
    if not flag:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._free_blocks
    if getattr(original, "_kvtool_delay", False):
        return
    delay_s = float(os.environ.get("KVTOOL_TEST_DELAY_FREE_MS", "300")) / 1000.0

    def _free_blocks(self, request):
        if os.path.exists(flag):
            time.sleep(delay_s)
        return original(self, request)

    _free_blocks._kvtool_delay = True
    Scheduler._free_blocks = _free_blocks
