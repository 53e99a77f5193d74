"""The database-side audit (issue 15): the grouped statement answers exactly what the row-by-row
walk of the raw tables answers (on SQLite and PostgreSQL, per tenant and for all, at several
clocks, with unregistered and unknown-tenant threads), output is streamed, the HTML thread
table is capped with a note, and the indexes the events / receipts window queries use are
created by setup() on databases that predate them."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.audit.inventory import _audit_walk, audit, audit_stream, iter_audit
from langgraph_securesaver.audit.report_html import write_html
from langgraph_securesaver.cli import main as cli_module
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.errors import ConfigurationError
from langgraph_securesaver.keys.provider import NoKeys
from langgraph_securesaver.ops.pruner import shares_database
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.tenancy import thread_prefix
from tests.test_audit import DAY, build

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module.console, "width", 250)
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


def _add_stray_rows(url: str) -> None:
    """A thread the registry lost, and a stored thread whose tag names no tenant."""
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        saver.registry.forget_thread("acme", "t-plain")
        with saver.registry.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, "
                "checkpoint, metadata) SELECT 'tffffffffffffffffffffffff:ghost', checkpoint_ns, "
                "checkpoint_id, type, checkpoint, metadata FROM checkpoints WHERE thread_id "
                "LIKE :pattern"), {"pattern": "%:g-live"})


def _check_against_walk(url: str) -> None:
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        assert shares_database(saver)
        tenants = saver.registry.tenants()
        for offset in (0, 40 * DAY, 400 * DAY):
            now = time.time() + offset
            for tenant in (None, "acme", "globex"):
                new = audit(saver, tenant=tenant, now=now).as_dict()
                old = _audit_walk(saver, tenants, tenant, now, None).as_dict()
                assert new == old, (tenant, offset)
        report = audit(saver)
    assert any(not t.registered for t in report.threads)
    assert [o["thread_id"] for o in report.orphans] == ["tffffffffffffffffffffffff:ghost"]


def test_sql_audit_matches_the_row_walk_on_sqlite(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    _add_stray_rows(url)
    _check_against_walk(url)


@pytest.mark.postgres
def test_sql_audit_matches_the_row_walk_on_postgres(pg_url: str, redactor) -> None:
    build(pg_url, redactor)
    _add_stray_rows(pg_url)
    _check_against_walk(pg_url)


def test_streamed_json_is_the_report_and_is_written_as_it_is_read(tmp_path: Path,
                                                                  redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        now = time.time()
        full = audit(saver, now=now).as_dict()
        out = io.StringIO()
        summary = audit_stream(saver, out, now=now)
        streamed = json.loads(out.getvalue())
        stream, finish = iter_audit(saver, now=now)
        first = next(stream)                 # a thread is out before the rest is read
        assert (first.tenant, first.thread_id) == ("acme", "t-held")
        assert sum(1 for _ in stream) == len(full["threads"]) - 1
        assert finish().threads == len(full["threads"])
    assert next(iter(streamed)) == "threads"  # threads first, summaries after them
    for key in full:
        assert streamed[key] == full[key], key
    assert summary.ok is False and summary.overdue == 1
    cli = runner.invoke(app, ["audit", "--url", url, "--format", "json"])
    assert cli.exit_code == 1
    data = json.loads(cli.stdout)
    assert [t["thread_id"] for t in data["threads"]] == [t["thread_id"] for t in full["threads"]]
    assert data["tenants"] == full["tenants"]
    target = tmp_path / "audit.json"
    to_file = runner.invoke(app, ["audit", "--url", url, "--tenant", "acme", "--format", "json",
                                  "--out", str(target)])
    assert to_file.exit_code == 0
    assert {t["tenant"] for t in json.loads(target.read_text())["threads"]} == {"acme"}


def test_html_thread_table_is_capped_with_a_note_and_summaries_count_everything(
        tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        stream, finish = iter_audit(saver)
        out = io.StringIO()
        summary = write_html(stream, finish, out, max_threads=2)
    page = out.getvalue()
    assert summary.threads == 5
    threads_table = page.split("<h2>Threads</h2>", 1)[1].split("</table>", 1)[0]
    assert threads_table.count("<tr") == 1 + 2          # header + the 2 shown
    assert 'id="threads-capped"' in page and "first 2 of 5 threads" in page
    assert "1 of them past expiry or unregistered" in page   # g-expired is not shown
    tenants_table = page.split("<h2>Tenants</h2>", 1)[1].split("</table>", 1)[0]
    numbers = re.findall(r"<td class=n[^>]*>(\d+)</td>", tenants_table)
    assert "3" in numbers and "2" in numbers
    cli = runner.invoke(app, ["audit", "--url", url, "--format", "html"])
    assert cli.exit_code == 1 and "threads-capped" not in cli.stdout   # 5 < 2,000


def _index_names(url: str) -> set[str]:
    """The indexes as they are, without running setup()."""
    engine = sa.create_engine(normalize_url(url))
    try:
        inspector = sa.inspect(engine)
        return {ix["name"] for table in ("securesaver_events", "securesaver_receipts")
                for ix in inspector.get_indexes(table)}
    finally:
        engine.dispose()


WINDOW_INDEXES = {"ix_securesaver_events_tenant_at", "ix_securesaver_receipts_tenant_at"}


def check_window_indexes(url: str) -> None:
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            conn.execute(sa.text("INSERT INTO securesaver_events (at, kind, tenant, detail) "
                                 "VALUES (1, 'access_denied', 'acme', '{}')"))
    assert WINDOW_INDEXES <= _index_names(url)
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        assert [e.kind for e in saver.events(tenant="acme")] == ["access_denied"]


def test_setup_creates_the_window_indexes_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    check_window_indexes(url)
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM securesaver_events WHERE tenant = 'acme' "
            "AND at >= 1 AND at < 2 ORDER BY id"))
    assert "ix_securesaver_events_tenant_at" in plan


@pytest.mark.postgres
def test_events_of_one_tenant_and_window_come_from_the_index_on_postgres(pg_url: str) -> None:
    check_window_indexes(pg_url)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:     # enough rows that a scan would cost more
            conn.execute(sa.text(
                "INSERT INTO securesaver_events (at, kind, tenant, thread_id, actor, detail) "
                "SELECT e, 'access_denied', 'tenant-' || (e % 50), NULL, NULL, '{}' "
                "FROM generate_series(1, 20000) AS e"))
            conn.execute(sa.text(
                "INSERT INTO securesaver_receipts (receipt_id, tenant, thread_id, deleted_at, "
                "action, reason, detail) SELECT md5(r::text), 'tenant-' || (r % 50), 'x', r, "
                "'deleted', 'test', '{}' FROM generate_series(1, 20000) AS r"))
            conn.execute(sa.text("ANALYZE securesaver_events"))
            conn.execute(sa.text("ANALYZE securesaver_receipts"))
            plans = []
            for table, column in (("securesaver_events", "at"),
                                  ("securesaver_receipts", "deleted_at")):
                plans.append(" ".join(r[0] for r in conn.execute(sa.text(
                    f"EXPLAIN SELECT * FROM {table} WHERE tenant = 'tenant-7' "
                    f"AND {column} >= 100 AND {column} < 5000 ORDER BY id"))))
        entries = saver.events(tenant="tenant-7", since=100, until=5000)
    assert "ix_securesaver_events_tenant_at" in plans[0], plans[0]
    assert "ix_securesaver_receipts_tenant_at" in plans[1], plans[1]
    assert len(entries) == 2 * len([n for n in range(100, 5000) if n % 50 == 7])


_NO_WRITES = ("NOT EXISTS (SELECT 1 FROM writes w WHERE w.thread_id = c.thread_id AND "
              "w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)")
# rows SecureSaver never writes, one of each kind the predicates name, per backend
_SQLITE_TAMPER = [
    # metadata without the sealed value
    "UPDATE checkpoints SET metadata = '{\"step\": 1}' WHERE rowid = (SELECT min(rowid) "
    "FROM checkpoints WHERE thread_id LIKE '%_t-plain')",
    # a checkpoint body that does not decode
    # (bodies are replaced on checkpoints without pending writes: a write is aged by its own
    # checkpoint's timestamp in the walk, by the thread's latest in SQL)
    "UPDATE checkpoints SET checkpoint = X'c1c1' WHERE rowid = (SELECT max(rowid) "
    f"FROM checkpoints c WHERE thread_id LIKE '%_t-plain' AND {_NO_WRITES})",
    # a body holding a msgpack extension (a constructor payload): foreign
    "UPDATE checkpoints SET checkpoint = X'81a178c70301616263' WHERE rowid = (SELECT min(rowid) "
    f"FROM checkpoints c WHERE thread_id LIKE '%_g-live' AND {_NO_WRITES})",
    # a pending write in the clear, and one typed bytes that is no ciphertext
    "UPDATE writes SET type = 'json', value = CAST('{\"a\": 1}' AS BLOB) WHERE rowid = "
    "(SELECT min(rowid) FROM writes WHERE thread_id LIKE '%_t-pii')",
    "UPDATE writes SET type = 'bytes', value = X'5353' WHERE rowid = (SELECT max(rowid) "
    "FROM writes WHERE thread_id LIKE '%_g-expired')",
]
_PG_TAMPER = [
    "UPDATE checkpoints SET metadata = metadata - '__securesaver__' WHERE checkpoint_id = "
    "(SELECT min(checkpoint_id) FROM checkpoints WHERE thread_id LIKE '%_t-plain')",
    "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{__securesaver__}', '7') WHERE "
    "checkpoint_id = (SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id LIKE '%_t-pii')",
    "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{channel_values}', "
    "'{\"messages\": \"hello\"}') WHERE checkpoint_id = (SELECT max(checkpoint_id) "
    "FROM checkpoints WHERE thread_id LIKE '%_g-live')",
    "UPDATE checkpoints SET metadata = '[\"__securesaver__\"]' WHERE checkpoint_id = (SELECT "
    "max(checkpoint_id) FROM checkpoints WHERE thread_id LIKE '%_t-held')",
    "UPDATE checkpoints SET checkpoint = '[1, 2]' WHERE checkpoint_id = (SELECT min("
    "checkpoint_id) FROM checkpoints c WHERE thread_id LIKE '%_g-expired' AND "
    f"{_NO_WRITES.replace('FROM writes', 'FROM checkpoint_writes')})",
    "UPDATE checkpoint_blobs SET blob = convert_to('plain text', 'UTF8') WHERE (thread_id, "
    "channel, version) = (SELECT thread_id, channel, version FROM checkpoint_blobs WHERE "
    "thread_id LIKE '%_t-held' AND type = 'bytes' ORDER BY version LIMIT 1)",
    "UPDATE checkpoint_writes SET type = 'json' WHERE (thread_id, checkpoint_id, task_id, idx) "
    "= (SELECT thread_id, checkpoint_id, task_id, idx FROM checkpoint_writes WHERE thread_id "
    "LIKE '%_t-pii' ORDER BY checkpoint_id LIMIT 1)",
]


def _check_unsealed(url: str, statements: list[str], expected: dict[str | None, int]) -> None:
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for sql in statements:
                assert conn.execute(sa.text(sql)).rowcount == 1, sql
        tenants = saver.registry.tenants()
        now = time.time()
        for tenant, n in expected.items():
            new = audit(saver, tenant=tenant, now=now).as_dict()
            old = _audit_walk(saver, tenants, tenant, now, None).as_dict()
            assert new == old, tenant
            counted = [p for p in new["problems"] if "never writes" in p]
            assert sum(int(p.split()[0]) for p in counted) == n, (tenant, counted)


def test_sql_audit_counts_rows_securesaver_never_writes_like_the_walk_on_sqlite(
        tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    _check_unsealed(url, _SQLITE_TAMPER, {None: 5, "acme": 3, "globex": 2})


@pytest.mark.postgres
def test_sql_audit_counts_rows_securesaver_never_writes_like_the_walk_on_postgres(
        pg_url: str, redactor) -> None:
    build(pg_url, redactor)
    _check_unsealed(pg_url, _PG_TAMPER, {None: 7, "acme": 5, "globex": 2})


#: What the compliance commands (audit, events) never import on a database SecureSaver set up:
#: the saver (LangGraph, LangChain), the redaction stack, the key providers' SDKs and the
#: PostgreSQL driver (SQLite). A name covers its submodules. (pydantic is loaded: Typer >= 0.29
#: converts option values with it.)
_HEAVY = ("langchain_core", "langgraph.checkpoint.base", "langgraph.checkpoint.sqlite",
          "langgraph.checkpoint.postgres", "langgraph.graph", "langgraph.pregel",
          "presidio_analyzer", "spacy", "langgraph_securesaver.saver",
          "langgraph_securesaver.redaction", "boto3",
          "botocore", "pkcs11", "psycopg")
#: ``events`` reads the registry only: no LangGraph at all, no msgpack, no raw-table reader, none
#: of the inventory's statements and report types.
_HEAVY_EVENTS = (*_HEAVY, "langgraph", "ormsgpack", "langgraph_securesaver.storage.raw_tables",
                 "langgraph_securesaver.storage.strict_serde", "langgraph_securesaver.audit.sql",
                 "langgraph_securesaver.audit.report", "langgraph_securesaver.audit.inventory")
_LOADED = """
import json, sys
from langgraph_securesaver.cli.main import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = {heavy!r}
print(json.dumps(sorted(m for m in sys.modules
                        if any(m == h or m.startswith(h + ".") for h in heavy))),
      file=sys.stderr)
"""


def _heavy_modules_loaded(args: list[str], cwd: Path,
                          heavy: tuple[str, ...] = _HEAVY) -> tuple[list[str], str]:
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "SECURESAVER_MASTER_KEY"}
    proc = subprocess.run([sys.executable, "-c", _LOADED.format(heavy=heavy), *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    return json.loads(proc.stderr.strip().splitlines()[-1]), proc.stdout


def test_audit_and_events_commands_start_without_langgraph_langchain_or_presidio(
        tmp_path: Path, redactor) -> None:
    """The compliance commands read the registry's engine only: importing the CLI and running
    them loads neither the saver (LangGraph, LangChain) nor the redaction stack, in every
    output format, for one tenant or all."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    loaded, out = _heavy_modules_loaded(["audit", "--url", url, "--format", "json"], tmp_path)
    assert loaded == []
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        expected = audit(saver).as_dict()
    assert [t["thread_id"] for t in json.loads(out)["threads"]] == [
        t["thread_id"] for t in expected["threads"]]
    loaded, out = _heavy_modules_loaded(["events", "--url", url, "--format", "json"], tmp_path,
                                        _HEAVY_EVENTS)
    assert loaded == [] and json.loads(out)
    for args in (["audit", "--url", url, "--tenant", "acme"], ["audit", "--url", url],
                 ["audit", "--url", url, "--tenant", "globex", "--format", "json"]):
        loaded, out = _heavy_modules_loaded(args, tmp_path)
        assert loaded == [], args
        assert ("g-expired" if "globex" in args else "t-pii") in out, args
    for args in (["events", "--url", url, "--tenant", "acme"],
                 ["events", "--url", url, "--tenant", "acme", "--since", "7d", "--limit", "5",
                  "--kind", "receipt", "--format", "json"]):
        loaded, out = _heavy_modules_loaded(args, tmp_path, _HEAVY_EVENTS)
        assert loaded == [] and out, args
    loaded, _ = _heavy_modules_loaded(["--help"], tmp_path, _HEAVY_EVENTS)
    assert loaded == []


#: On PostgreSQL the audit needs no decoder of raw rows at all: no LangGraph module, no msgpack.
_HEAVY_PG = ("langgraph", "langchain_core", "ormsgpack", "presidio_analyzer", "spacy",
             "cryptography", "rich", "regex", "langgraph_securesaver.saver",
             "langgraph_securesaver.redaction", "langgraph_securesaver.storage.raw_tables",
             "langgraph_securesaver.storage.strict_serde", "langgraph_securesaver.keys.crypto")


@pytest.mark.postgres
def test_audit_json_on_postgres_loads_no_langgraph_no_keys_no_rich(pg_url: str, tmp_path: Path,
                                                                    redactor) -> None:
    """A JSON audit and the trail on PostgreSQL, as the compliance benchmark runs them: the
    registry's engine and the driver, nothing that decodes, decrypts or draws."""
    build(pg_url, redactor)
    for args in (["audit", "--url", pg_url, "--format", "json"],
                 ["audit", "--url", pg_url, "--tenant", "acme", "--format", "json"],
                 ["events", "--url", pg_url, "--tenant", "acme", "--format", "json"]):
        loaded, out = _heavy_modules_loaded(args, tmp_path, _HEAVY_PG)
        assert loaded == [], (args, loaded)
        assert json.loads(out), args


_STARTUP = ("pydantic", "cryptography", "langgraph_securesaver.keys.keyring", "rich.table",
            "rich", "regex")


def test_help_loads_no_keyring_and_json_output_no_rich_table(tmp_path: Path, redactor) -> None:
    """``--help`` needs neither the keyring (cryptography) nor pydantic, a JSON report no
    rich at all, and ``audit``/``events`` without a keyring no cryptography. (Typer >= 0.29
    converts every other parameter value with pydantic, so a command that runs, and
    ``<command> --help``, do load it.)"""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    loaded, _ = _heavy_modules_loaded(["--help"], tmp_path, _STARTUP)
    assert loaded == []                     # plain help (rich_markup_mode=None): no rich table
    for command in ("events", "audit", "keygen"):
        loaded, out = _heavy_modules_loaded([command, "--help"], tmp_path, _STARTUP)
        assert "cryptography" not in loaded and "langgraph_securesaver.keys.keyring" not in loaded
        assert "--help" in out
    for command in ("audit", "events"):
        loaded, out = _heavy_modules_loaded([command, "--url", url, "--format", "json"],
                                            tmp_path, _STARTUP)
        assert json.loads(out)
        # no keyring given or set: the registry and the audit name keys without the cipher;
        # JSON goes out through typer.echo: no rich console; ASCII ids need no Unicode tables
        assert [m for m in loaded if m.split(".")[0] in ("cryptography", "rich", "regex")
                or m == "langgraph_securesaver.keys.keyring"] == [], loaded
        assert "pydantic" in loaded         # the watch sees what a command does load
    loaded, out = _heavy_modules_loaded(["audit", "--url", url], tmp_path, _STARTUP)
    assert "rich.table" in loaded and "t-pii" in out   # a table report still imports it
    assert "regex" not in loaded and "cryptography" not in loaded


def test_audit_of_a_database_without_checkpoint_tables_refuses_and_creates_nothing(
        tmp_path: Path) -> None:
    """A database that holds no checkpoints (a registry-only file, a wrong URL) is not reported
    clean: the command cannot see the backend, says so, and creates no checkpoint tables."""
    db = tmp_path / "empty.db"
    sqlite3.connect(db).close()            # a file, no tables at all
    url = f"sqlite:///{db}"
    result = runner.invoke(app, ["audit", "--url", url, "--format", "json"])
    assert result.exit_code == 2, result.output
    assert "no checkpoint tables" in result.output and result.stdout.strip() == ""
    with sqlite3.connect(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not {"checkpoints", "writes", "checkpoint_blobs"} & names, names


def test_audit_database_view_is_operator_access_and_refuses_a_tenant_scope(
        tmp_path: Path, redactor) -> None:
    from langgraph_securesaver import AccessDenied, tenant_scope
    from langgraph_securesaver.audit.inventory import AuditDatabase
    from langgraph_securesaver.audit.trail import events
    from langgraph_securesaver.registry.core import Registry
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    registry = Registry(url)
    try:
        view = AuditDatabase(registry)
        assert view.has_inner_tables()
        with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
            now = time.time()
            for tenant in (None, "acme"):
                assert audit(view, tenant=tenant, now=now).as_dict() == audit(
                    saver, tenant=tenant, now=now).as_dict()
            assert events(view) == events(saver)
        with tenant_scope("acme"):
            with pytest.raises(AccessDenied):
                audit(view)
            with pytest.raises(AccessDenied):
                events(view, tenant="acme")
    finally:
        registry.dispose()


def test_thread_json_is_json_dumps_of_as_dict() -> None:
    """The streamed audit writes each thread with ``thread_json``: byte for byte the text of
    ``json.dumps(th.as_dict(), default=str)``, on every field type and awkward value."""
    from langgraph_securesaver.audit.inventory import ThreadAudit, thread_json
    cases = [
        ThreadAudit("acme", "t-1", 1.7e9, 1.7e9 + 0.5, None, False, "default", 86400.0, None,
                    "active", 10, 4096, [1, 2, 70], {"EMAIL": 2, "PHONE": 1}, 1.7e9, 1.7e9 + 9,
                    registered=True, overdue=True, held_past_ttl=False),
        ThreadAudit('qu"ote\\s', "ünï\u2028cødé\n\t", None, None, 0.0, True, None, None,
                    1e300, None, 0, 0, [], {}, None, None, registered=False),
        ThreadAudit("x", "y", -1.0, 2.5e9, 1e-3, True, "tenant", float("nan"), float("inf"),
                    "held", 2**70, -1, [0], {"k\u00e9y": 3}, 0.0, 1.0),
    ]
    # times around day, year and epoch boundaries, before 1970, fractions, far years
    times = [0.0, -0.5, -86400.0, -86400.5, 86399.999999, 951782400.0, 1.7e9 + 0.999999,
             -62135596800.0, 253402300799.0, 253402300800.0, -1e20, 1e20, 4e10 + 0.5]
    for ts in times:
        cases.append(ThreadAudit("t", "u", ts, ts, ts, False, None, None, None, None,
                                 first_checkpoint=ts, last_checkpoint=ts))
    cases.append(ThreadAudit("t", "u", None, None, None, 1, None, None, None, None,  # type: ignore[arg-type]
                             registered=0, overdue=None, held_past_ttl="yes"))  # type: ignore[arg-type]
    for versions in ([7], [True], ["x"], [2**70], [], {3}, (4,)):
        cases.append(ThreadAudit("t", "u", None, None, None, False, None, None, None, None,
                                 True, 2.5, versions, {"K": True}))  # type: ignore[arg-type]
    # flags of every combination; tenants, policy sources and states that are no str or
    # need escaping
    for r, o, h in ((r, o, h) for r in (False, True) for o in (False, True)
                    for h in (False, True)):
        cases.append(ThreadAudit("acme", "t", None, None, None, h, "default", None, None,
                                 "active", registered=r, overdue=o, held_past_ttl=h))
    for label in ("acme", 'qu"ote', "del", "ünï", "", None, 3, b"raw"):
        cases += [ThreadAudit(label, "t", None, None, None, False, label, None, None,  # type: ignore[arg-type]
                              label)] * 2  # type: ignore[arg-type]
    for th in cases:
        assert thread_json(th) == json.dumps(th.as_dict(), default=str), th


def test_read_commands_check_the_schema_without_ddl(tmp_path: Path) -> None:
    """``audit``/``events`` open the registry with ``ready_for_reading``: True only when every
    table and index setup() creates exists at this library's schema version; it creates
    nothing (a fresh file stays empty), and anything missing sends them to setup()."""
    from langgraph_securesaver.registry.core import Registry
    path = tmp_path / "r.db"
    sqlite3.connect(path).close()
    url = f"sqlite:///{path}"
    fresh = Registry(url)
    assert fresh.ready_for_reading() is False
    fresh.dispose()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    done = Registry(url)
    done.setup()
    done.dispose()
    ready = Registry(url)
    assert ready.ready_for_reading() is True
    assert ready.ready_for_reading(["checkpoints"]) is False   # an inner table it lacks
    ready.dispose()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP INDEX ix_securesaver_events_tenant_at")
    assert Registry(url).ready_for_reading() is False
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE securesaver_meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(ConfigurationError, match="schema version '0'"):
        Registry(url).ready_for_reading()


def _reheader(token: bytes, version: int) -> bytes:
    """The same ciphertext under another key version in its header (the audit reads headers
    only; nothing is decrypted)."""
    return token[:3] + version.to_bytes(4, "big") + token[7:]


@pytest.mark.postgres
def test_key_versions_past_the_bit_mask_come_from_text_and_binary_headers(
        pg_url: str, redactor) -> None:
    """Versions are read from text tokens (checkpoint metadata, base64 in JSONB) and binary
    ones (blobs, writes); a mask holds versions below 63, a list the rest: versions on both
    sides of that line, and one past 2**31, come out as the row walk reads them."""
    from langgraph_securesaver.keys.tokens import from_text, to_text
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            rows = conn.execute(sa.text(
                "SELECT thread_id, checkpoint_id, metadata ->> '__securesaver__' FROM checkpoints "
                "WHERE thread_id LIKE '%_t-plain' ORDER BY checkpoint_id")).all()
            for (thread_id, checkpoint_id, text), version in zip(rows, (62, 63, 2**31 + 5),
                                                                    strict=False):
                sealed = to_text(_reheader(from_text(text), version))
                conn.execute(sa.text(
                    "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{__securesaver__}', "
                    "to_jsonb(CAST(:t AS text))) WHERE thread_id = :th AND checkpoint_id = :c"),
                    {"t": sealed, "th": thread_id, "c": checkpoint_id})
            blob = conn.execute(sa.text(
                "SELECT thread_id, channel, version, blob FROM checkpoint_blobs WHERE thread_id "
                "LIKE '%_g-live' AND type = 'bytes' ORDER BY version LIMIT 1")).one()
            conn.execute(sa.text(
                "UPDATE checkpoint_blobs SET blob = :b WHERE thread_id = :th AND channel = :ch "
                "AND version = :v"), {"b": _reheader(bytes(blob[3]), 64), "th": blob[0],
                                      "ch": blob[1], "v": blob[2]})
        tenants = saver.registry.tenants()
        now = time.time()
        new = audit(saver, now=now)
        assert new.as_dict() == _audit_walk(saver, tenants, None, now, None).as_dict()
    versions = {t.thread_id: set(t.key_versions) for t in new.threads}
    assert {62, 63, 2**31 + 5} <= versions["t-plain"]
    assert 64 in versions["g-live"]


@pytest.mark.postgres
def test_an_audit_abandoned_midway_leaves_the_database_usable(pg_url: str, redactor) -> None:
    """The rows arrive through libpq's chunked mode: leaving the stream after one thread
    (a closed pipe, an exception in the caller) must end the statement, not wedge the pool."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        for _ in range(3):
            stream, _finish = iter_audit(saver)
            first = next(stream)
            stream.close()                       # what a broken consumer leaves behind
            assert first.tenant == "acme"
        whole = audit(saver)
    assert len(whole.threads) == 5


def _counting_functions(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count every call SQLite makes into a Python function the audit registers (scalar or
    aggregate step), and every checkpoint row decoded."""
    import types

    from langgraph_securesaver.audit import sql as audit_sql
    from langgraph_securesaver.storage import raw_tables
    calls: dict[str, int] = {}
    registered = audit_sql._sqlite_functions

    def counting(conn: Any) -> None:
        raw = conn.connection.driver_connection

        def count(name: str) -> None:
            calls[name] = calls.get(name, 0) + 1

        class Registering:
            def create_function(self, name: str, n: int, fn: Any, **kw: Any) -> None:
                def wrapped(*args: Any) -> Any:
                    count(name)
                    return fn(*args)
                raw.create_function(name, n, wrapped, **kw)

            def create_aggregate(self, name: str, n: int, cls: Any) -> None:
                class Counted(cls):
                    def step(self, *args: Any) -> None:
                        count(name)
                        super().step(*args)
                raw.create_aggregate(name, n, Counted)

        registered(types.SimpleNamespace(
            connection=types.SimpleNamespace(driver_connection=Registering())))

    decode = raw_tables.decode_sqlite_checkpoint

    def decoding(*args: Any, **kwargs: Any) -> Any:
        calls["(decoded)"] = calls.get("(decoded)", 0) + 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(audit_sql, "_sqlite_functions", counting)
    monkeypatch.setattr(raw_tables, "decode_sqlite_checkpoint", decoding)
    return calls


def test_sqlite_audit_calls_python_once_per_checkpoint_row(tmp_path: Path, redactor,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Each checkpoint row crosses into Python once and is decoded once (the statement named
    a per-row function ~22 times a row: in first/last, every age bucket, the unknown age...),
    for all tenants and for one, and the report is still the walk's."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    _add_stray_rows(url)
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        rows = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        acme = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id LIKE ?",
                            (thread_prefix("acme") + "%",)).fetchone()[0]
    assert rows > acme > 5
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        now = time.time()
        walk = _audit_walk(saver, saver.registry.tenants(), None, now, None).as_dict()
        calls = _counting_functions(monkeypatch)
        report = audit(saver, now=now).as_dict()
        assert sum(calls.values()) == 2 * rows, calls     # one call, one decode, a row
        assert calls["(decoded)"] == rows
        assert report == walk
        calls.clear()
        audit(saver, tenant="acme", now=now)
        assert sum(calls.values()) == 2 * acme, calls


def test_sqlite_statement_joins_no_computed_table_by_scanning_it(tmp_path: Path, redactor
                                                                 ) -> None:
    """The SQLite plan: every per-thread join or existence test is a key lookup (a scan of a
    computed table per stored thread was quadratic: a minute for 20k threads); only the
    tenants' tag list may be scanned."""
    from langgraph_securesaver.audit.sql import _sqlite_functions
    from langgraph_securesaver.audit.statements import inventory_sqlite
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    for tenant in (None, "acme"):
        sql, params = inventory_sqlite(["acme", "globex"], tenant, time.time())
        with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver, \
                saver.registry.begin() as conn:
            _sqlite_functions(conn)
            plan = conn.connection.driver_connection.execute(
                "EXPLAIN QUERY PLAN " + sql, params).fetchall()
        parents = {node: parent for node, parent, _, _ in plan}
        details = {node: detail for node, _, _, detail in plan}
        for node, _parent, _, detail in plan:
            correlated = any("CORRELATED" in details.get(p, "")
                             for p in (parents.get(node), parents.get(parents.get(node, 0))))
            if detail.startswith("SCAN ") and ("LEFT-JOIN" in detail or correlated):
                assert detail.startswith(("SCAN tg", "SCAN tags")), (tenant, detail, plan)
