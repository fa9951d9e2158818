"""vllm serve's async-scheduling default per release (its own module: the request resolves it before any step,
and serve_defaults, which imports the request, re-exports it)."""

from __future__ import annotations

from typing import NamedTuple

from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick


class AsyncSchedulingRule(NamedTuple):
    """``vllm serve``'s async-scheduling default (no --async-scheduling flag) on a GPU, for the releases from
    ``since``."""

    since: str
    source: str
    default: bool  # without pipeline parallelism
    with_pp: bool  # at --pipeline-parallel-size > 1


ASYNC_SCHEDULING_RULES: tuple[AsyncSchedulingRule, ...] = (
    # SchedulerConfig.async_scheduling: bool = False (vllm/config/scheduler.py (0.10.1); vllm/config.py in 0.10.0)
    AsyncSchedulingRule("0.10.0", "vllm/config/scheduler.py SchedulerConfig (0.10.0)", default=False, with_pp=False),
    # the field defaults to None and VllmConfig.__post_init__ turns it on "unless there is an incompatible option",
    # the first of which is pipeline_parallel_size > 1
    AsyncSchedulingRule("0.14.0", "vllm/config/vllm.py VllmConfig.__post_init__ (0.14.0)", default=True, with_pp=False),
    # pipeline parallelism is no longer among the exceptions
    AsyncSchedulingRule("0.15.0", "vllm/config/vllm.py VllmConfig.__post_init__ (0.15.0)", default=True, with_pp=True),
    # off again at PP > 1 with the V1 model runner ("does not support it with pipeline parallelism"): the V1 runner
    # is what vLLM uses where Model Runner V2 lacks a feature, so this assumes it
    AsyncSchedulingRule("0.31.0", "vllm/config/vllm.py VllmConfig.__post_init__ (0.31.0)", default=True, with_pp=False),
    # the PP exception is gone again
    AsyncSchedulingRule("0.33.0", "vllm/config/vllm.py VllmConfig.__post_init__ (0.33.0)", default=True, with_pp=True),
)


def default_async_scheduling(vllm_version: str = NEWEST_RELEASE, pp: int = 1) -> bool:
    """Whether ``vllm serve`` of ``vllm_version`` schedules asynchronously when not told, at ``pp`` stages."""
    rule = pick(ASYNC_SCHEDULING_RULES, vllm_version)
    return rule.with_pp if pp > 1 else rule.default
