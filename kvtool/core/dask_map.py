"""Independent tasks on Dask, as `kvtool analyze --workers/--scheduler` runs its files: a local cluster of N worker
processes (one thread each), or an existing scheduler's; results in the order of the inputs.

Used by `kvtool analyze --workers` (kvtool.events.fleet) and `kvtool simulate --sweep --workers`:
``workers`` a positive count, ``scheduler`` an address checked the way distributed parses it, an unreachable one a
usage error; errors a user can cause (KvtoolError) raised from a worker unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvtool.core.errors import UsageError


def check_dask_options(workers: int | None, scheduler: str | None) -> None:
    if workers is not None and workers <= 0:
        raise UsageError(f"--workers must be a positive number of processes, got {workers}", where="--workers")
    if workers is not None and scheduler is not None:
        raise UsageError(
            "give --workers (a local cluster) or --scheduler (an existing one), not both", where="--workers"
        )
    if scheduler is not None:
        from kvtool.core.extras import require

        require("dask.distributed", feature="--scheduler")
        from distributed.comm.addressing import parse_address, parse_host_port

        try:
            scheme, location = parse_address(scheduler)
            if scheme in ("tcp", "tls"):
                parse_host_port(location)
        except ValueError:
            raise UsageError(
                f"not a Dask scheduler address: {scheduler!r}", where="--scheduler", tip="give tcp://HOST:8786"
            ) from None


def map_on_dask(
    fn: Callable[..., Any],
    items: Sequence[Any],
    shared: Any,
    *,
    workers: int | None,
    scheduler: str | None,
    feature: str,
    progress: Callable[[int, int], None] | None = None,
    each: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """``[fn(item, shared) for item in items]`` on Dask (``shared`` sent once to every worker); ``progress(done,
    total)`` and ``each(index, result)`` as results come in."""
    from kvtool.core.extras import require

    require("dask.distributed", feature=feature)
    import contextlib
    import logging

    from dask.distributed import Client, LocalCluster, as_completed

    check_dask_options(workers, scheduler)
    with contextlib.ExitStack() as stack:
        try:
            if scheduler is not None:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            else:
                cluster = stack.enter_context(
                    LocalCluster(
                        n_workers=workers,
                        threads_per_worker=1,
                        processes=True,
                        dashboard_address=None,
                        silence_logs=logging.ERROR,
                    )
                )
                client = stack.enter_context(Client(cluster))
        except (OSError, TimeoutError) as err:
            raise UsageError(f"cannot reach the Dask scheduler: {type(err).__name__}", where=scheduler) from None
        shared_future = client.scatter(shared, broadcast=True)
        futures = {client.submit(fn, item, shared_future, pure=False): i for i, item in enumerate(items)}
        results: list[Any] = [None] * len(items)
        done = 0
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            done += 1
            if each is not None:
                each(i, results[i])
            if progress is not None:
                progress(done, len(items))
    return results
