"""Keys bound to their database: a key row (and the ciphertexts it opens) copied from another
database that shares the keyring is refused on read and reported by both verify commands;
databases written before the binding are migrated by ``setup()``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.tenancy import inner_thread_id
from tests.fake_agent import build_chat_graph

BACKENDS = ["sqlite", "postgres"]
runner = CliRunner()


def _cfg(thread: str, tenant: str = "acme") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _sql(url: str, statement: str, params: Any = None) -> list[Any]:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params or {})
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()


def _copy_rows(src: str, dst: str, table: str, where: str, params: dict[str, Any]) -> int:
    """Copy rows matching ``where`` from ``src`` to ``dst`` (replacing rows of the same key),
    as an attacker with write access to both databases would."""
    s_engine, d_engine = sa.create_engine(normalize_url(src)), sa.create_engine(normalize_url(dst))
    try:
        with s_engine.connect() as conn:
            result = conn.execute(sa.text(f"SELECT * FROM {table} WHERE {where}"), params)
            cols = list(result.keys())
            rows = [dict(zip(cols, r, strict=True)) for r in result]
        jsonb = {c for r in rows for c in cols if isinstance(r[c], (dict, list))}
        marks = ", ".join(f"CAST(:{c} AS jsonb)" if c in jsonb else f":{c}" for c in cols)
        with d_engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {table} WHERE {where}"), params)
            for row in rows:
                conn.execute(sa.text(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})"),
                             {c: json.dumps(v) if c in jsonb else v for c, v in row.items()})
        return len(rows)
    finally:
        s_engine.dispose()
        d_engine.dispose()


@pytest.fixture(params=BACKENDS)
def two_urls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    from tests.conftest import drop_pg_schema, new_pg_schema, pg_url_in
    first = request.getfixturevalue("pg_url")
    schema = new_pg_schema()
    request.addfinalizer(lambda: drop_pg_schema(schema))
    return first, pg_url_in(schema)


def _inner_tables(url: str) -> list[str]:
    return (["checkpoints", "writes"] if url.startswith("sqlite")
            else ["checkpoints", "checkpoint_blobs", "checkpoint_writes"])


def _verify_cli(command: str, url: str, ring: Path) -> tuple[int, str]:
    args = [command, "--url", url, "--verify", "--keyring", str(ring), "--format", "json"]
    result = runner.invoke(app, args, env={"SECURESAVER_MASTER_KEY": ""})
    return result.exit_code, result.output


def test_a_key_row_and_checkpoint_copied_from_another_database_are_refused(
        two_urls: tuple[str, str], tmp_path: Path) -> None:
    a, b = two_urls
    ring_path = Keyring.generate().save(tmp_path / "keyring.json")
    for url, text in ((a, "A's secret conversation"), (b, "B's own conversation")):
        with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                                  redaction=None) as saver:
            build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _cfg("t1"))
    with SecureSaver.from_url(a, keyring=Keyring.from_file(ring_path), redaction=None) as saver:
        assert saver.rotate_data_key("acme") == 2          # a data-key version B lacks
        build_chat_graph(saver).invoke({"messages": [HumanMessage("A again")]}, _cfg("t1"))
    # the attack: A's acme data-key row v2, and A's whole t1 (latest checkpoint, its blobs
    # and writes), copied into B
    assert _copy_rows(a, b, "securesaver_tenant_keys", "tenant = :t AND version = 2",
                      {"t": "acme"}) == 1
    inner = inner_thread_id("acme", "t1")
    for table in _inner_tables(a):
        _copy_rows(a, b, table, "thread_id = :th", {"th": inner})
    with SecureSaver.from_url(b, keyring=Keyring.from_file(ring_path), redaction=None) as saver:
        with pytest.raises(TamperedDataError):
            saver.get_tuple(_cfg("t1"))
        with pytest.raises(TamperedDataError):
            build_chat_graph(saver).invoke({"messages": [HumanMessage("continue")]},
                                           _cfg("t1"))
    code, output = _verify_cli("scan", b, ring_path)
    assert code == 1, output
    assert "key_does_not_unwrap" in output
    code, output = _verify_cli("events", b, ring_path)
    assert code == 1, output
    problems = json.loads(output)["problems"]
    assert any(p["table"] == "securesaver_tenant_keys" for p in problems), problems
    # A itself is intact and verifies
    assert _verify_cli("events", a, ring_path)[0] == 0

