"""The recorder's rows, driven through a miniature of vLLM's scheduler (tests/support/fake_vllm.py).

Expected rows are worked out by hand from the calls each test makes (block ids are handed out 1, 2, 3, ... by the
fake pool; blocks of 4 tokens); the recorded run against real vLLM is checked in test_vllm_record_fixture.py.
"""

from __future__ import annotations

import time

import pytest

from kvtool.vllm.recorder.hooks import Hooks
from kvtool.vllm.recorder.recorder import Recorder, RecorderOptions, sampled
from tests.support.fake_vllm import KVCacheBlocks, KVCacheManager, Request, RequestStatus, Scheduler


class Sink:
    def __init__(self):
        self.rows: list[tuple] = []

    def __call__(self, rows, count):
        self.rows.extend(rows[:count])


def recording(manager=None, **options):
    manager = manager or KVCacheManager(num_blocks=32, block_size=4)
    scheduler = Scheduler(manager)
    sink = Sink()
    groups = len(manager.coordinator.single_type_managers)
    recorder = Recorder(RecorderOptions(path="x.csv", **options), sink, groups=groups)
    windowed = tuple(i for i, m in enumerate(manager.coordinator.single_type_managers) if m.window_blocks)
    Hooks(scheduler, recorder, RequestStatus.FINISHED_ABORTED).install(windowed)
    return scheduler, manager, recorder, sink


def rows_of(sink, *fields):
    names = ("ts", "event", "rid", "blocks", "tokens", "ids", "latency", "source", "pool", "reason", "step", "groups")
    return [tuple(row[names.index(f)] for f in fields) for row in sink.rows]


def step(scheduler, recorder):
    scheduler.schedule()
    scheduler.update_from_output()


def test_admission_append_and_finish():
    scheduler, manager, recorder, sink = recording()
    a = Request("a", 10)
    scheduler.schedule()
    assert manager.allocate_slots(a, 10) is not None  # 10 tokens -> 3 blocks of 4: ids 1 2 3
    assert manager.allocate_slots(a, 1).blocks == ([],)  # token 11 fits in block 3
    assert len(manager.allocate_slots(a, 2).blocks[0]) == 1  # tokens 12-13: block 4
    scheduler.update_from_output()
    scheduler.finish(a)
    recorder.hand_over()
    assert rows_of(sink, "event", "rid", "blocks", "tokens", "ids", "reason") == [
        ("allocate", "a", 3, 10, [1, 2, 3], None),
        ("append", "a", 0, 1, [], None),
        ("append", "a", 1, 2, [4], None),
        ("free", "a", 4, 0, [1, 2, 3, 4], "finished"),
    ]
    alloc, free = sink.rows[0], sink.rows[-1]
    assert alloc[6] >= 0 and free[6] >= 0  # allocation latency, free latency (ms)
    assert alloc[8] == 31 - 3  # free pool after: 31 usable blocks (the null block is id 0) minus 3


def test_prefix_hit_is_a_reuse_row_with_its_source_only_when_admitted():
    scheduler, manager, recorder, sink = recording(manager=KVCacheManager(num_blocks=8, block_size=4))
    a, b, c = Request("a-0123abcd", 12), Request("b", 14), Request("c", 40)
    manager.allocate_slots(a, 12)  # blocks 1 2 3
    hit = KVCacheBlocks(([manager.coordinator.single_type_managers[0].req_to_blocks["a-0123abcd"][i] for i in (0, 1)],))
    # c does not fit (10 blocks, 4 free): a failed admission leaves no row, whatever the lookup found
    assert manager.allocate_slots(c, 40, num_new_computed_tokens=8, new_computed_blocks=hit) is None
    assert manager.allocate_slots(b, 6, num_new_computed_tokens=8, new_computed_blocks=hit) is not None
    recorder.hand_over()
    assert rows_of(sink, "event", "rid", "blocks", "tokens", "ids", "source") == [
        ("allocate", "a-0123abcd", 3, 12, [1, 2, 3], None),
        ("reuse", "b", 2, 8, [1, 2], "a-0123abcd"),  # the deepest hit block (2) was allocated by a
        ("allocate", "b", 2, 6, [4, 5], None),
    ]


def test_preemption_abort_and_readmission():
    scheduler, manager, recorder, sink = recording()
    a, b = Request("a", 8), Request("b", 4)
    manager.allocate_slots(a, 8)
    manager.allocate_slots(b, 4)
    a.status = RequestStatus.RUNNING
    scheduler._preempt_request(a)
    manager.allocate_slots(a, 9)  # admitted again: an allocate, not an append
    scheduler.finish(b, RequestStatus.FINISHED_ABORTED)
    scheduler.finish(a)
    recorder.hand_over()
    assert rows_of(sink, "event", "rid", "blocks", "reason") == [
        ("allocate", "a", 2, None),
        ("allocate", "b", 1, None),
        ("free", "a", 2, "preempted"),
        ("allocate", "a", 3, None),
        ("free", "b", 1, "aborted"),
        ("free", "a", 3, "finished"),
    ]
    preempted = sink.rows[2]
    assert preempted[6] is None  # no "time since finished" for a preemption


def test_a_delayed_free_records_how_late_it_came():
    scheduler, manager, recorder, sink = recording()
    a = Request("a", 8)
    manager.allocate_slots(a, 8)
    scheduler.finish(a, delay_free_blocks=True)  # a KV connector still sends the blocks
    time.sleep(0.03)
    manager.free(a)
    recorder.hand_over()
    free = sink.rows[-1]
    assert free[1] == "free" and free[9] == "finished"
    assert 30 <= free[6] < 5000  # ms between the request finishing and its blocks coming back


def test_sliding_window_releases_mid_request_and_filters_the_null_block():
    manager = KVCacheManager(num_blocks=32, block_size=4, window_blocks=2)
    scheduler, manager, recorder, sink = recording(manager)
    a = Request("a", 12)
    manager.allocate_slots(a, 12)  # blocks 1 2 3 (12 tokens; the window is 2 blocks)
    manager.allocate_slots(a, 4)  # 12 computed: block 1 leaves the window; block 4 is new
    manager.allocate_slots(a, 4)  # 16 computed: block 2 leaves; block 5 is new
    scheduler.finish(a)
    recorder.hand_over()
    assert rows_of(sink, "event", "blocks", "ids", "reason") == [
        ("allocate", 3, [1, 2, 3], None),
        ("free", 1, [1], "window"),
        ("append", 1, [4], None),
        ("free", 1, [2], "window"),
        ("append", 1, [5], None),
        ("free", 3, [3, 4, 5], "finished"),  # the null blocks in front are not listed
    ]
    attached = sum(r[3] for r in sink.rows if r[1] != "free")
    assert attached == sum(r[3] for r in sink.rows if r[1] == "free") == 5


def test_hybrid_groups_list_both_groups_with_their_counts():
    manager = KVCacheManager(num_blocks=32, block_size=4, window_blocks=8, hybrid=True)
    scheduler, manager, recorder, sink = recording(manager)
    a = Request("a", 8)
    manager.allocate_slots(a, 8)  # 2 blocks in each group: 1 2 (full attention), 3 4 (sliding window)
    scheduler.finish(a)
    recorder.hand_over()
    assert rows_of(sink, "event", "blocks", "ids", "groups") == [
        ("allocate", 4, [1, 2, 3, 4], (2, 2)),
        ("free", 4, [1, 2, 3, 4], (2, 2)),
    ]


def test_block_appends_only_drops_appends_that_add_no_block():
    scheduler, manager, recorder, sink = recording(appends="blocks")
    a = Request("a", 3)
    manager.allocate_slots(a, 3)
    manager.allocate_slots(a, 1)  # fits in block 1
    manager.allocate_slots(a, 1)  # block 2
    recorder.hand_over()
    assert rows_of(sink, "event", "blocks") == [("allocate", 1), ("append", 1)]


def test_sampling_keeps_whole_requests_by_hash_and_still_knows_sources():
    ids = [f"req-{i}" for i in range(400)]
    kept = [r for r in ids if sampled(r, 0.25)]
    assert 60 < len(kept) < 140  # crc32 spreads ids evenly: about a quarter
    assert kept == [r for r in ids if sampled(r, 0.25)]  # the same choice every time
    unsampled_source = next(r for r in ids if not sampled(r, 0.25))
    hitter = next(r for r in ids if sampled(r, 0.25))
    scheduler, manager, recorder, sink = recording(sample=0.25)
    src, hit_req = Request(unsampled_source, 8), Request(hitter, 12)
    manager.allocate_slots(src, 8)
    hit = KVCacheBlocks((list(manager.coordinator.single_type_managers[0].req_to_blocks[unsampled_source]),))
    manager.allocate_slots(hit_req, 4, num_new_computed_tokens=8, new_computed_blocks=hit)
    scheduler.finish(src)
    recorder.hand_over()
    assert {r[2] for r in sink.rows} == {hitter}
    assert rows_of(sink, "event", "source") == [("reuse", unsampled_source), ("allocate", None)]


def test_an_error_in_the_recorder_turns_it_off_once_and_vllm_goes_on(capsys):
    scheduler, manager, recorder, sink = recording()

    def broken(*_):
        raise RuntimeError("disk on fire")

    recorder.add = broken
    a, b = Request("a", 4), Request("b", 4)
    assert manager.allocate_slots(a, 4).blocks[0][0].block_id == 1
    assert manager.allocate_slots(b, 4).blocks[0][0].block_id == 2  # vLLM's call ran exactly once each time
    scheduler.finish(a)
    assert not recorder.on
    err = capsys.readouterr().err
    assert err.count("kvtool recorder: turned off") == 1 and "disk on fire" in err
    assert manager.block_pool.get_num_free_blocks() == 30  # a's block came back: the free itself ran


def test_a_writer_failure_turns_the_recorder_off_at_the_next_step(capsys):
    scheduler, manager, recorder, sink = recording()
    recorder.sink_error = lambda: OSError(28, "No space left on device")
    step(scheduler, recorder)
    assert not recorder.on and "No space left" in capsys.readouterr().err


@pytest.mark.parametrize("rate", [0.0, -1, 1.5])
def test_bad_sample_rates_are_refused(rate):
    from kvtool.vllm.recorder.plugin import options_from_env

    with pytest.raises(ValueError, match="KVTOOL_RECORD_SAMPLE"):
        options_from_env({"KVTOOL_RECORD": "e.parquet", "KVTOOL_RECORD_SAMPLE": str(rate)})


def test_the_recorders_memory_is_bounded_by_the_requests_in_flight(tmp_path):
    # before: the writer kept every request id it ever wrote (about 230 MB per million ids, never shrinking)
    from kvtool.vllm.recorder.writer import RowWriter, output_paths

    manager = KVCacheManager(num_blocks=64, block_size=4)
    scheduler = Scheduler(manager)
    writer = RowWriter(output_paths(tmp_path / "e.csv", 0, 1), 4, randomized_ids=True, hybrid=False)
    recorder = Recorder(RecorderOptions(path="e.csv", sample=0.5), writer.put, spare=writer.spare)
    Hooks(scheduler, recorder, RequestStatus.FINISHED_ABORTED).install(())
    in_flight = []
    for i in range(3000):
        scheduler.schedule()
        request = Request(f"r{i}-0123abcd", 6)
        assert manager.allocate_slots(request, 6) is not None
        in_flight.append(request)
        if len(in_flight) > 5:  # five requests stay in flight
            scheduler.finish(
                in_flight.pop(0),
                status=RequestStatus.FINISHED_ABORTED if i % 7 == 0 else RequestStatus.FINISHED_STOPPED,
            )
        scheduler.update_from_output()
    writer.close()
    assert writer.error is None and writer.rows_written > 1000
    assert len(writer._ids) <= 5  # only requests still in flight (sampled ones) keep their id
    assert len(recorder._sampled) <= 6 and len(recorder.finishing) == 0
