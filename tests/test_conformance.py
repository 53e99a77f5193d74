"""The public langgraph-checkpoint-conformance suite, against SecureSaver on every backend."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
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


class SyncDriven(BaseCheckpointSaver):
    """Drives the suite through SecureSaver's *sync* methods (in a worker thread)."""

    def __init__(self, saver: SecureSaver) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    async def aget_tuple(self, config):
        return await asyncio.to_thread(self.saver.get_tuple, config)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        rows = await asyncio.to_thread(lambda: list(self.saver.list(
            config, filter=filter, before=before, limit=limit)))
        for row in rows:
            yield row

    async def aput(self, config, checkpoint, metadata, new_versions):
        return await asyncio.to_thread(self.saver.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        await asyncio.to_thread(self.saver.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id):
        await asyncio.to_thread(self.saver.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids):
        await asyncio.to_thread(self.saver.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id, target_thread_id):
        await asyncio.to_thread(self.saver.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids, *, strategy="keep_latest"):
        await asyncio.to_thread(self.saver.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current, channel):
        return self.saver.get_next_version(current, channel)


async def test_conformance_through_the_sync_api_in_memory() -> None:
    @checkpointer_test(name="SecureSaver[InMemorySaver] sync API")
    async def factory() -> AsyncIterator[BaseCheckpointSaver]:
        yield SyncDriven(SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                                     default_tenant="conformance"))

    await _check(factory)


async def test_conformance_through_the_sync_api_sqlite(tmp_path: Path) -> None:
    @checkpointer_test(name="SecureSaver[SqliteSaver] sync API")
    async def factory() -> AsyncIterator[BaseCheckpointSaver]:
        with SecureSaver.from_url(f"sqlite:///{tmp_path / uuid.uuid4().hex}.db",
                                  keyring=Keyring.generate(), redaction=None,
                                  default_tenant="conformance") as saver:
            yield SyncDriven(saver)

    await _check(factory)


@pytest.mark.postgres
async def test_conformance_through_the_sync_api_postgres() -> None:
    require_postgres()

    @checkpointer_test(name="SecureSaver[PostgresSaver] sync API")
    async def factory() -> AsyncIterator[BaseCheckpointSaver]:
        schema = new_pg_schema()
        try:
            with SecureSaver.from_url(pg_url_in(schema), keyring=Keyring.generate(),
                                      redaction=None, default_tenant="conformance") as saver:
                yield SyncDriven(saver)
        finally:
            drop_pg_schema(schema)

    await _check(factory)


async def test_conformance_with_default_redaction_on(tmp_path: Path) -> None:
    """Redaction on (the default) is transparent to the checkpoint contract."""
    @checkpointer_test(name="SecureSaver[SqliteSaver] redaction on")
    async def factory() -> AsyncIterator[SecureSaver]:
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / uuid.uuid4().hex}.db",
                                         keyring=Keyring.generate(),
                                         default_tenant="conformance") as saver:
            yield saver

    await _check(factory)
