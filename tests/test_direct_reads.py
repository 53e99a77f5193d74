"""The erasure epoch's direct reads (direct_reads.DirectReads): every read sees the latest
committed value, a connection the server dropped is replaced, close() closes them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from langgraph_securesaver.registry.core import Registry
from langgraph_securesaver.registry.pii_vault import PiiVault

from .conftest import Raw


def _bump(url: str, tenant: str, epoch: int) -> None:
    """Another process's erasure: a committed epoch change on a connection of its own."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM securesaver_pii_epoch WHERE tenant = :t"),
                         {"t": tenant})
            conn.execute(sa.text("INSERT INTO securesaver_pii_epoch (tenant, epoch) "
                                 "VALUES (:t, :e)"), {"t": tenant, "e": epoch})
    finally:
        engine.dispose()


def test_epoch_reads_see_every_commit_and_survive_a_dropped_connection(
        database: tuple[str, Raw], tmp_path: Path) -> None:
    url, raw = database
    registry = Registry(url)
    registry.setup()
    vault = PiiVault(registry)
    try:
        assert vault._read_epoch("acme") == 0
        for epoch in (1, 2, 7):
            _bump(url, "acme", epoch)
            assert vault._read_epoch("acme") == epoch   # no snapshot or cache in between
        assert vault._read_epoch("globex") == 0
        if raw.backend == "postgres":
            # the server drops the idle connection (restart, idle timeout): the next read
            # is made on a new one
            import psycopg
            pids = set()
            for conn in registry.direct._free:
                pids.add(conn.info.backend_pid)
            assert pids
            with psycopg.connect(url, autocommit=True) as admin:
                for pid in pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            _bump(url, "acme", 9)
            assert vault._read_epoch("acme") == 9
        idle = list(registry.direct._free)
        assert idle
        registry.dispose()
        assert registry.direct._free == []
        with pytest.raises(registry.engine.dialect.loaded_dbapi.Error):   # closed, not pooled
            idle[0].cursor().execute("SELECT 1")
        assert vault._read_epoch("acme") == (9 if raw.backend == "postgres" else 7)
    finally:
        registry.dispose()


def test_an_in_memory_registry_keeps_its_one_connection() -> None:
    """SQLite in memory lives in the pool's only connection: reads use it, never take it."""
    registry = Registry.in_memory()
    registry.setup()
    vault = PiiVault(registry)
    try:
        assert vault._read_epoch("acme") == 0
        with registry.begin() as conn:
            conn.execute(sa.text("INSERT INTO securesaver_pii_epoch (tenant, epoch) "
                                 "VALUES ('acme', 3)"))
        assert vault._read_epoch("acme") == 3
        assert vault._read_public("acme", ["<EMAIL_ADDRESS:" + "0" * 32 + ">"]) == {}
        with registry.begin() as conn:   # the database (and its tables) are still there
            assert conn.execute(sa.text("SELECT count(*) FROM securesaver_pii_epoch")
                                ).scalar() == 1
    finally:
        registry.dispose()


GRACE = 1.0  # how long the writer keeps its transaction open for the reader (a bound only)


def test_a_direct_read_waits_for_a_transaction_open_on_the_one_shared_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-memory registry is ONE connection for every thread. A direct read (the vault's
    erasure epoch, read on every redacting read and write) made while another thread's
    transaction is open on it must neither see nor end that transaction. It did both: the
    read's rollback rolled the other transaction back, so a thread key inserted and read back
    in one transaction read back as missing ("the thread's data key was deleted while it was
    being written"), and the insert was lost. The writer is paused right after its insert
    until the reader has read (or for GRACE, when the read rightly waits for the commit)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from langgraph_securesaver import Keyring, SecureSaver
    from langgraph_securesaver.keys.tokens import THREAD
    from langgraph_securesaver.registry.schema import thread_keys

    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate())  # registry in memory
    registry, store = saver.registry, saver.keys.threads
    assert store is not None
    inserted, read = threading.Event(), threading.Event()
    insert = registry._insert_ignore

    def paused_insert(conn: Any, table: sa.Table, rows: Any) -> None:
        insert(conn, table, rows)
        if table is thread_keys:
            inserted.set()
            read.wait(GRACE)

    monkeypatch.setattr(registry, "_insert_ignore", paused_insert)
    epochs: list[int] = []

    def reader() -> None:
        if inserted.wait(120):
            epochs.append(saver.vault._read_epoch("acme"))
        read.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        key = store.key("acme", THREAD, "t1", True)
    finally:
        inserted.set()
        thread.join(120)
    assert key is not None            # created, and read back in its own transaction
    assert epochs == [0]
    monkeypatch.undo()
    store.forget()
    assert store.key("acme", THREAD, "t1", False) is not None   # and committed
