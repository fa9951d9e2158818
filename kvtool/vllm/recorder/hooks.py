"""The wrappers that feed a :class:`~kvtool.vllm.recorder.recorder.Recorder` from one vLLM scheduler (instance attributes).

Each wrapper calls vLLM's own method exactly once, with the arguments it was given, whatever the recorder does:
the recorder's part runs in ``try`` blocks, and an error there turns the recorder off (``Recorder.fail``).  The time
spent in the recorder's part (not in vLLM's) is added to ``Recorder.cost_ns``.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from kvtool.vllm.recorder.recorder import AllocateCall, Recorder


class Hooks:
    """Wrappers bound to one scheduler, its KV-cache manager and a recorder."""

    def __init__(self, scheduler: Any, recorder: Recorder, aborted_status: Any):
        self.rec = recorder
        self.aborted_status = aborted_status
        self.scheduler = scheduler
        self.manager = manager = scheduler.kv_cache_manager
        self.pool = manager.block_pool
        self.managers = tuple(manager.coordinator.single_type_managers)
        # one KV-cache group (most models): its request -> blocks map, looked up directly on the hot path
        self.single = self.managers[0].req_to_blocks if len(self.managers) == 1 else None
        self._allocate = manager.allocate_slots
        self._free = manager.free
        self._pop = manager.pop_blocks_for_free
        self._preempt = scheduler._preempt_request
        self._free_request = scheduler._free_request
        self._schedule = scheduler.schedule
        self._update = scheduler.update_from_output
        self._pool_free = self.pool.free_blocks

    def install(self, windowed: tuple[int, ...]) -> None:
        """Put the wrappers in place; ``windowed``: groups whose manager releases blocks mid-request."""
        self.manager.allocate_slots = self.allocate_slots
        self.manager.free = self.free
        self.manager.pop_blocks_for_free = self.pop_blocks_for_free
        self.scheduler._preempt_request = self.preempt_request
        self.scheduler._free_request = self.free_request
        self.scheduler.schedule = self.schedule
        self.scheduler.update_from_output = self.update_from_output
        if windowed:
            self.pool.free_blocks = self.pool_free_blocks
            for group in windowed:
                manager = self.managers[group]
                manager.remove_skipped_blocks = self._window_hook(group, manager.remove_skipped_blocks)

    def _blocks(self, request_id: str) -> list[list]:
        return [list(m.req_to_blocks.get(request_id) or ()) for m in self.managers]

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        *args,
        **kwargs,
    ):
        """Rows for one ``allocate_slots``: an append for a running request (the hot path), else an admission."""
        rec = self.rec
        if not rec.on:
            return self._allocate(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, *args, **kwargs
            )
        t0 = perf_counter_ns()
        before = None
        try:
            rid = request.request_id
            if self.single is not None:
                held = self.single.get(rid)
                before = [len(held) if held else 0]
            else:
                before = [len(m.req_to_blocks.get(rid) or ()) for m in self.managers]
        except Exception as err:
            rec.fail(err, "allocate_slots")
        t1 = perf_counter_ns()
        result = self._allocate(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, *args, **kwargs)
        t2 = perf_counter_ns()
        if before is not None and result is not None and rec.on:
            try:
                if any(before):
                    rec.appended(rid, result.blocks, num_new_tokens, self.pool)
                else:
                    call = AllocateCall(
                        request_id=rid,
                        num_new_tokens=num_new_tokens,
                        num_new_computed_tokens=num_new_computed_tokens,
                        num_external_tokens=kwargs.get("num_external_computed_tokens", 0),
                        hit_blocks=None if new_computed_blocks is None else new_computed_blocks.blocks,
                        before=before,
                        result=result,
                        elapsed_ns=t2 - t1,
                    )
                    after = [m.req_to_blocks.get(rid) or () for m in self.managers]
                    rec.admitted(call, after, self.pool.get_num_free_blocks())
            except Exception as err:
                rec.fail(err, "allocate_slots")
        rec.cost_ns += (t1 - t0) + (perf_counter_ns() - t2)
        return result

    def _release(self, original, request: Any):
        """A free or a pop of the request's blocks: the original, and a row for a sampled request."""
        rec = self.rec
        if not rec.on:
            return original(request)
        t0 = perf_counter_ns()
        blocks = rid = None
        try:
            rid = request.request_id
            if rec.is_sampled(rid):
                blocks = self._blocks(rid)
        except Exception as err:
            rec.fail(err, "free")
        t1 = perf_counter_ns()
        result = original(request)
        t2 = perf_counter_ns()
        if rid is not None and rec.on:
            try:
                rec.freed(rid, blocks, self.pool.get_num_free_blocks())
            except Exception as err:
                rec.fail(err, "free")
        rec.cost_ns += (t1 - t0) + (perf_counter_ns() - t2)
        return result

    def free(self, request: Any) -> None:
        return self._release(self._free, request)

    def pop_blocks_for_free(self, request: Any):
        return self._release(self._pop, request)

    def preempt_request(self, request: Any, *args, **kwargs):
        self.rec.preempting = True
        try:
            return self._preempt(request, *args, **kwargs)
        finally:
            self.rec.preempting = False

    def free_request(self, request: Any, *args, **kwargs):
        rec = self.rec
        if rec.on:
            try:
                rec.finished(request, self.aborted_status)
            except Exception as err:
                rec.fail(err, "_free_request")
        return self._free_request(request, *args, **kwargs)

    def schedule(self, *args, **kwargs):
        rec = self.rec
        if rec.on:
            t0 = perf_counter_ns()
            try:
                rec.new_step()
            except Exception as err:
                rec.fail(err, "schedule")
            rec.cost_ns += perf_counter_ns() - t0
        return self._schedule(*args, **kwargs)

    def update_from_output(self, *args, **kwargs):
        """The end of an engine step: its rows (and the frees of requests that just finished) go to the writer."""
        result = self._update(*args, **kwargs)
        rec = self.rec
        if rec.on:
            t0 = perf_counter_ns()
            try:
                rec.end_step()
            except Exception as err:
                rec.fail(err, "update_from_output")
            rec.cost_ns += perf_counter_ns() - t0
        return result

    def _window_hook(self, group: int, original):
        hooks = self

        def remove_skipped_blocks(request_id: str, *args, **kwargs):
            return hooks.remove_skipped_blocks(group, original, request_id, *args, **kwargs)

        return remove_skipped_blocks

    def remove_skipped_blocks(self, group: int, original, request_id: str, *args, **kwargs):
        """A sliding-window manager drops blocks that left the window: they pass through ``pool_free_blocks``."""
        rec = self.rec
        if not rec.on or not rec.is_sampled(request_id):
            return original(request_id, *args, **kwargs)
        rec.window_request = request_id
        rec.window_released = []
        try:
            return original(request_id, *args, **kwargs)
        finally:
            rec.window_request = None
            if rec.window_released and rec.on:
                t0 = perf_counter_ns()
                try:
                    rec.window_freed(request_id, group, rec.window_released, self.pool.get_num_free_blocks())
                except Exception as err:
                    rec.fail(err, "remove_skipped_blocks")
                rec.cost_ns += perf_counter_ns() - t0

    def pool_free_blocks(self, ordered_blocks, *args, **kwargs):
        rec = self.rec
        if rec.window_request is None:
            return self._pool_free(ordered_blocks, *args, **kwargs)
        blocks = list(ordered_blocks)
        try:
            rec.window_released.extend(b.block_id for b in blocks if not b.is_null)
        except Exception as err:
            rec.fail(err, "free_blocks")
        return self._pool_free(blocks, *args, **kwargs)
