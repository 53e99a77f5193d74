"""The public langgraph-checkpoint-conformance suite, against SecureSaver on every backend."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_securesaver import Keyring, SecureSaver

from .conftest import drop_pg_schema, new_pg_schema, pg_url_in, require_postgres

ALL = {"put", "put_writes", "get_tuple", "list", "delete_thread",
       "delete_for_runs", "copy_thread", "prune"}


async def _check(registered) -> None:
    report = await validate(registered)
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is not True}
    assert not failures, failures
    assert {cap for cap, r in report.results.items() if r.passed} == ALL


async def test_conformance_in_memory() -> None:
    @checkpointer_test(name="SecureSaver[InMemorySaver]")
    async def factory() -> AsyncIterator[SecureSaver]:
        yield SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                          default_tenant="conformance")

    await _check(factory)


async def test_conformance_sqlite_sync_saver(tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    @checkpointer_test(name="SecureSaver[SqliteSaver]")
    async def factory() -> AsyncIterator[SecureSaver]:
        path = tmp_path / f"{uuid.uuid4().hex}.db"
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SecureSaver(SqliteSaver(conn), keyring=Keyring.generate(), redaction=None,
                            default_tenant="conformance")
        saver.setup()
        yield saver
        conn.close()

    await _check(factory)


async def test_conformance_sqlite_async_saver(tmp_path: Path) -> None:
    @checkpointer_test(name="SecureSaver[AsyncSqliteSaver]")
    async def factory() -> AsyncIterator[SecureSaver]:
        path = tmp_path / f"{uuid.uuid4().hex}.db"
        async with SecureSaver.afrom_url(f"sqlite:///{path}", keyring=Keyring.generate(),
                                         redaction=None, default_tenant="conformance") as saver:
            yield saver

    await _check(factory)


@pytest.mark.postgres
async def test_conformance_postgres_sync_saver() -> None:
    require_postgres()

    @checkpointer_test(name="SecureSaver[PostgresSaver]")
    async def factory() -> AsyncIterator[SecureSaver]:
        schema = new_pg_schema()
        try:
            with SecureSaver.from_url(pg_url_in(schema), keyring=Keyring.generate(),
                                      redaction=None, default_tenant="conformance") as saver:
                yield saver
        finally:
            drop_pg_schema(schema)

    await _check(factory)


@pytest.mark.postgres
async def test_conformance_postgres_async_saver() -> None:
    require_postgres()

    @checkpointer_test(name="SecureSaver[AsyncPostgresSaver]")
    async def factory() -> AsyncIterator[SecureSaver]:
        schema = new_pg_schema()
        try:
            async with SecureSaver.afrom_url(pg_url_in(schema), keyring=Keyring.generate(),
                                             redaction=None, default_tenant="conformance") as s:
                yield s
        finally:
            drop_pg_schema(schema)

    await _check(factory)
