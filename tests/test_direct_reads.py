"""The erasure epoch's direct reads (direct_reads.DirectReads): every read sees the latest
committed value, a connection the server dropped is replaced, close() closes them."""

from __future__ import annotations

from pathlib import Path

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
