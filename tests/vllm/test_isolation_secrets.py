"""Secrets never written (issue 25): tenants' API keys stay out of --record files, errors and --json, URL
credentials are masked, and a redacted record replays to the same verdicts.  Against the fake engine of
tests/vllm/isolation_fake.py; no vLLM needed."""

from __future__ import annotations

import json
import stat

import pytest

from kvtool.core.jsonable import to_jsonable
from kvtool.core.redact import redact_url, without_secrets
from kvtool.vllm.isolation.plan import DimensionPartitions, Partition, PlanOptions, plan_trials
from kvtool.vllm.isolation.record import RECORD_FORMAT, EngineInfo, IsolationRecord, read_record
from tests.vllm.isolation_fake import FakeVllm

# distinctive keys: none of them can occur in a record, a path or a message by chance
ACME_KEY = "sk-acme-7Qz9XvB2wLp4"
GLOBEX_KEY = "sk-globex-Hn3Kd8Rt5Ym1"
OTHER_KEY = "sk-other-Wc6Jf2Ns9Ue4"
KEYS = (ACME_KEY, GLOBEX_KEY, OTHER_KEY)


def _isolation(run_cli, fake: FakeVllm, *extra) -> object:
    return run_cli(
        "vllm", "isolation", "--endpoint", fake.url, "--dimension", "salt", "--repeats", "1", "--seed", "3",
        "--api-key", f"acme={ACME_KEY}", "--api-key", f"globex={GLOBEX_KEY}", *extra,
    )  # fmt: skip


def _leaked(text: str) -> list[str]:
    return [key for key in KEYS if key in text]


@pytest.mark.parametrize(("salted", "exit_code"), [(True, 0), (False, 1)])
def test_no_key_in_the_record_stdout_or_stderr_and_the_replay_agrees(run_cli, tmp_path, salted, exit_code):
    # a gateway that salts by key passes; one that does not leaks between the two tenants (both cases, so the
    # replay has to tell the tenants apart from their labels alone)
    record = tmp_path / "run.json"
    with FakeVllm(salt_from_key=salted, adapters=()) as fake:
        live = _isolation(run_cli, fake, "--record", record, "--json")
    with FakeVllm(salt_from_key=salted, adapters=()) as fake:  # the table, and --key for every other request
        table = _isolation(run_cli, fake, "--record", tmp_path / "table.json", "--key", OTHER_KEY)
    assert live.exit_code == exit_code, live.stderr
    assert table.exit_code in (0, 1) and "Tenants (cache_salt):" in table.stdout
    for result in (live, table):
        assert _leaked(result.stdout + result.stderr) == []
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert [p.name for p in written] == ["run.json", "table.json"]
    for path in written:
        assert _leaked(path.read_text(encoding="utf-8")) == [], path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path  # the owner only, not 0644
    # tenants are told apart by labels: one per distinct key, in the order they first appear
    partitions = {(p.partition.label, p.partition.api_key) for p in read_record(record).plan.probes}
    assert {k for label, k in partitions if label.startswith("tenant:")} == {"key#1", "key#2"}
    assert {k for label, k in partitions if not label.startswith("tenant:")} == {None}
    replay = run_cli("vllm", "isolation", "--replay", record, "--json")
    assert replay.exit_code == exit_code and _leaked(replay.stdout + replay.stderr) == []
    assert json.loads(replay.stdout) == json.loads(live.stdout)  # every verdict, row and reason the same
    tenant_rows = [r for r in json.loads(live.stdout)["dimensions"][0]["rows"] if r["first"].startswith("tenant:")]
    assert {r["verdict"] for r in tenant_rows} == {"pass" if salted else "leak"} and len(tenant_rows) == 4


def test_a_record_that_exists_already_is_made_owner_only(run_cli, tmp_path):
    record = tmp_path / "run.json"
    record.write_text("old", encoding="utf-8")
    record.chmod(0o644)
    with FakeVllm(salt_from_key=True, adapters=()) as fake:
        assert _isolation(run_cli, fake, "--record", record).exit_code == 0
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert read_record(record).format == "kvtool-isolation/1"


def test_a_record_with_plaintext_keys_is_redacted_when_read(tmp_path):
    # records written before the keys were redacted: replaying one never hands a key on
    from kvtool.vllm.isolation.record import redact_keys  # imported here: the tests above ran on the code before it

    pair = (Partition("tenant:a", api_key=ACME_KEY), Partition("tenant:b", api_key=ACME_KEY))
    plan = plan_trials((DimensionPartitions("salt", (pair,)),), PlanOptions(16, repeats=1, seed=1), "0")
    engine = EngineInfo("endpoint", "http://u:pw@h:1", "base", 16, None, None)
    record = IsolationRecord(RECORD_FORMAT, engine, plan, (), None, ())
    redacted = redact_keys(record)
    # two tenants with one key share one label: the verdicts must treat them as the same credentials
    assert {p.partition.api_key for p in redacted.plan.probes} == {"key#1"}
    assert redacted.engine.endpoint == "http://***@h:1"
    assert redact_keys(redacted) == redacted  # idempotent
    old = tmp_path / "old.json"
    old.write_text(json.dumps(to_jsonable(record)), encoding="utf-8")
    assert ACME_KEY in old.read_text(encoding="utf-8")
    assert {p.partition.api_key for p in read_record(old).plan.probes} == {"key#1"}


def test_a_server_that_quotes_the_refused_key_has_it_masked(run_cli):
    # OpenAI's API answers a wrong key with "Incorrect API key provided: <key>"; the error line quotes the answer
    with FakeVllm(adapters=(), refused_keys=frozenset({ACME_KEY})) as fake:
        result = _isolation(run_cli, fake, "--key", OTHER_KEY)
    assert result.exit_code == 2 and result.stdout == ""
    assert "answered HTTP 401: Incorrect API key provided: ***." in result.stderr
    assert _leaked(result.stderr) == []


def test_an_api_key_without_a_tenant_is_refused_without_quoting_it(run_cli):
    result = run_cli("vllm", "isolation", "--endpoint", "http://127.0.0.1:9", "--api-key", ACME_KEY)
    assert result.exit_code == 2
    assert result.stderr == "Error: --api-key takes TENANT=KEY; the value given has no '=' (--api-key)\n"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (  # credentials urllib would never send (it took them for part of the host name)
            ("vllm", "isolation", "--endpoint", "http://admin:hunter2pw@127.0.0.1:9"),
            "Error: --endpoint 'http://***@127.0.0.1:9' carries credentials, which kvtool does not send (--endpoint)",
        ),
        (
            ("vllm", "isolation", "--endpoint", "http://admin:hunter2pw@127.0.0.1:port"),
            "Error: --endpoint must be an http(s) URL with a host, not 'http://***@127.0.0.1:port' (--endpoint)",
        ),
        (
            ("vllm", "isolation", "--endpoint", "http://127.0.0.1:9", "--events", "tcp://admin:hunter2pw@h:5557"),
            "Error: --events 'tcp://***@h:5557' is not a ZMQ endpoint (--events)",
        ),
        (
            ("capture", "--endpoint", "tcp://admin:hunter2pw@127.0.0.1:5557", "-o", "out.jsonl"),
            "Error: --endpoint 'tcp://***@127.0.0.1:5557' is not a ZMQ endpoint (--endpoint)",
        ),
        (
            ("capture", "--endpoint", "tcp://admin:hunter2pw@127.0.0.1:99999", "-o", "out.jsonl"),
            "Error: --endpoint 'tcp://***@127.0.0.1:99999' is not a ZMQ endpoint (--endpoint)",
        ),
    ],
)
def test_a_password_in_an_endpoint_never_reaches_the_error_line(run_cli, args, line):
    result = run_cli(*args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines()[0] == line
    assert "hunter2pw" not in result.stderr and "admin" not in result.stderr


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("http://u:pw@host:8000/v1", "http://***@host:8000/v1"),
        ("https://token@host/path?q=a@b", "https://***@host/path?q=a@b"),  # an '@' after the authority stays
        ("http://u:p@ss@host", "http://***@host"),  # a raw '@' in the password: urlsplit splits at the last one
        ("cannot reach http://u:pw@h:1 and tcp://a:b@c:2", "cannot reach http://***@h:1 and tcp://***@c:2"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("junk", "junk"),
    ],
)
def test_redact_url(text, masked):
    assert redact_url(text) == masked


def test_without_secrets_masks_each_key_and_the_urls():
    assert without_secrets(f"bad {ACME_KEY} at http://u:pw@h", (ACME_KEY, None, "")) == "bad *** at http://***@h"
