"""No marker put through SecureStore (default settings: redaction on) appears anywhere in raw
storage -- the SQLite file and its WAL, every PostgreSQL table -- with semantic search on or
off; embeddings are computed on redacted text; the originals come back for the owner only."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import psycopg
import pytest

from langgraph_securesaver import Keyring, SecureStore, tenant_scope

from .graph_helpers import INT_MARKER, MARKERS, found_markers, sqlite_files_bytes, turns

EMBEDDED: list[str] = []


def _embed(texts: list[str]) -> list[list[float]]:
    """A deterministic offline embedding that records what it was shown."""
    EMBEDDED.extend(texts)
    out = []
    for text in texts:
        digest = hashlib.sha256(text.encode()).digest()
        out.append([b / 255 for b in digest[:16]])
    return out


INDEX = {"dims": 16, "embed": _embed, "fields": ["text", "note"]}


def _memories() -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    m = MARKERS
    items = [(("memories", "user-1"), f"turn-{i}", {"text": t, "n": INT_MARKER})
             for i, t in enumerate(turns())]
    items.append((("profile", "user-1"), "facts", {
        "note": m["metadata"], "email": m["email"], "tool": m["tool_arg"],
        "cfg": m["configurable"], "write": m["write"], "nested": {"deep": [m["message"]]}}))
    return items


def _fill(store: SecureStore) -> None:
    for ns, key, value in _memories():
        store.put(ns, key, value)


def _check_reads(store: SecureStore, search: bool) -> None:
    for ns, key, value in _memories():
        item = store.get(ns, key)
        assert item is not None and item.value == value
    found = store.search(("profile",), filter={"email": MARKERS["email"]})
    assert [i.key for i in found] == ["facts"]
    if search:
        hits = store.search(("memories",), query="where is my order")
        assert hits and all(h.score is not None for h in hits)
    with tenant_scope("globex"):
        assert store.search(()) == [] and store.get(("profile", "user-1"), "facts") is None


def _postgres_dump(url: str) -> bytes:
    out = []
    with psycopg.connect(url) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables "
                              "WHERE table_schema = current_schema()").fetchall()
        assert {"store", "securesaver_tenant_keys", "securesaver_pii_vault"} <= {
            t[0] for t in tables}
        for (table,) in tables:
            for (row,) in conn.execute(f'SELECT t::text FROM "{table}" t'):
                out.append(row)
    return "\n".join(out).encode()


def test_control_raw_sqlite_store_leaks_every_marker(tmp_path: Path) -> None:
    from langgraph.store.sqlite import SqliteStore
    db = tmp_path / "raw.db"
    with SqliteStore.from_conn_string(str(db)) as raw:
        raw.setup()
        for ns, key, value in _memories():
            raw.put(ns, key, value)
    assert set(found_markers(sqlite_files_bytes(db))) >= set(MARKERS) | {"int"}


@pytest.mark.parametrize("search", [False, True], ids=["search-off", "search-on"])
def test_sqlite_store_leaks_nothing(tmp_path: Path, search: bool) -> None:
    db = tmp_path / "agent.db"
    EMBEDDED.clear()
    options: dict[str, Any] = {"index": INDEX} if search else {}
    with SecureStore.from_url(f"sqlite:///{db}", keyring=Keyring.generate(),
                              default_tenant="acme", **options) as store:
        _fill(store)
        _check_reads(store, search)
        assert found_markers(sqlite_files_bytes(db)) == []
    assert found_markers(sqlite_files_bytes(db)) == []
    if search:  # the embedder saw text, but never the PII the redactor found
        assert EMBEDDED and not any(MARKERS["email"] in t for t in EMBEDDED)


@pytest.mark.postgres
@pytest.mark.parametrize("search", [False, True], ids=["search-off", "search-on"])
def test_postgres_store_leaks_nothing(pg_url: str, search: bool) -> None:
    options: dict[str, Any] = {"index": INDEX} if search else {}
    with SecureStore.from_url(pg_url, keyring=Keyring.generate(), default_tenant="acme",
                              **options) as store:
        _fill(store)
        _check_reads(store, search)
    assert found_markers(_postgres_dump(pg_url)) == []


def test_async_sqlite_store_leaks_nothing(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"

    async def run() -> None:
        async with SecureStore.afrom_url(f"sqlite:///{db}", keyring=Keyring.generate(),
                                         default_tenant="acme", index=INDEX) as store:
            for ns, key, value in _memories():
                await store.aput(ns, key, value)
            for ns, key, value in _memories():
                assert (await store.aget(ns, key)).value == value  # type: ignore[union-attr]
            assert await store.asearch(("memories",), query="order")
    asyncio.run(run())
    assert found_markers(sqlite_files_bytes(db)) == []


def test_deleted_item_takes_its_pii_originals(tmp_path: Path) -> None:
    """Deleting an item drops the vault originals no other item uses (carved with the live
    keyring: the vault rows are gone, not just unreferenced)."""
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", keyring=Keyring.generate(),
                              default_tenant="acme") as store:
        store.put(("m",), "a", {"text": f"mail me at {MARKERS['email']}"})
        store.put(("m",), "b", {"text": "call +1 415 555 0199 please"})
        vault = store.saver.vault
        before = vault.inventory("acme")
        assert before
        store.delete(("m",), "a")
        after = vault.inventory("acme")
        assert sum(sum(k.values()) for k in after.values()) < sum(
            sum(k.values()) for k in before.values())
        assert store.get(("m",), "b").value == {  # type: ignore[union-attr]
            "text": "call +1 415 555 0199 please"}


def test_forget_pii_and_shred_cover_store_items(tmp_path: Path) -> None:
    ring = Keyring.generate()
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", keyring=ring,
                              default_tenant="acme") as store:
        store.put(("m",), "a", {"text": f"mail me at {MARKERS['email']}"})
        assert store.saver.forget_pii("acme", MARKERS["email"]) == 1
        value = store.get(("m",), "a").value  # type: ignore[union-attr]
        assert MARKERS["email"] not in str(value) and "EMAIL" in str(value)
        with tenant_scope("globex"):
            store.put(("m",), "g", {"text": "globex data"})
        assert store.purge_tenant_items("acme") == 1
        assert store.get(("m",), "a") is None
        with tenant_scope("globex"):
            assert store.get(("m",), "g") is not None
