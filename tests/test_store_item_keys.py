"""Store items are crypto-erased like threads (issue 42) and a deleted item does not come back
(issue 43): each item is sealed under its own key (``securesaver_store_keys``), destroyed
before the item is deleted -- by ``delete``, ``forget_subject`` or the tenant's shredding.

The attacker writes to the database: they keep a copy of an item (a backup, a dump, a row
read before the deletion) and put it back afterwards, with the registry's key rows of the same
backup if they have those too. The operator runs several processes, each caching item keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.store.base import PutOp

from langgraph_securesaver import Keyring, SecureSaver, SecureStore, TamperedDataError
from langgraph_securesaver.audit.scan import scan
from langgraph_securesaver.registry.schema import normalize_url, store_keys
from langgraph_securesaver.store import codec
from langgraph_securesaver.tenancy import tenant_scope, tenant_tag

DANA = "user-dana-17"
NS, KEY = (DANA, "memories"), "m1"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


@contextmanager
def _pair(url: str, ring: Path) -> Iterator[tuple[SecureSaver, SecureStore]]:
    """A saver and a store as one process of the deployment opens them (own caches)."""
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(url, saver=saver) as store:
        yield saver, store


def _raw(store: SecureStore, ns: tuple[str, ...], key: str) -> Any:
    item = store.inner.get((tenant_tag("acme"), *ns), key)
    assert item is not None
    return item.value


def _put_back(store: SecureStore, ns: tuple[str, ...], key: str, value: Any) -> None:
    """What a database writer does: the inner store's row, written past SecureStore."""
    store.inner.batch([PutOp((tenant_tag("acme"), *ns), key, value)])


def _key_rows(url: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(sa.select(store_keys)).mappings()]
    finally:
        engine.dispose()


def _restore_key_rows(url: str, rows: list[dict[str, Any]]) -> None:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(store_keys.delete())
            conn.execute(store_keys.insert(), rows)
    finally:
        engine.dispose()


def test_a_deleted_item_put_back_is_refused_in_every_process(url: str, tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (_saver, store), tenant_scope("acme"):
        store.put(NS, KEY, {"text": "likes tea"})
        copy = _raw(store, NS, KEY)
        assert len(_key_rows(url)) == 1
        store.delete(NS, KEY)
        assert _key_rows(url) == []           # the key went with the item
        _put_back(store, NS, KEY, copy)
        with pytest.raises(TamperedDataError, match="no key"):
            store.get(NS, KEY)
        with pytest.raises(TamperedDataError):
            store.search((DANA,))
    with _pair(url, ring) as (saver, _store):            # what an auditor's scan reports
        report = scan(saver, keyring=Keyring.from_file(ring), verify=True)
        assert ("token_fails_authentication", "store") in {
            (v.kind, v.table) for v in report.violations}
    with _pair(url, ring) as (_saver, other), tenant_scope("acme"):   # a process started later
        with pytest.raises(TamperedDataError):
            other.get(NS, KEY)
        other.put(NS, KEY, {"text": "likes coffee"})     # written afresh: a new key, opens
        assert other.get(NS, KEY).value == {"text": "likes coffee"}  # type: ignore[union-attr]


def test_an_older_copy_of_a_deleted_and_rewritten_item_is_refused(url: str,
                                                                 tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (_saver, store), tenant_scope("acme"):
        store.put(NS, KEY, {"text": "v1"})
        old = _raw(store, NS, KEY)
        store.delete(NS, KEY)
        store.put(NS, KEY, {"text": "v2"})
        _put_back(store, NS, KEY, old)
        with pytest.raises(TamperedDataError):
            store.get(NS, KEY)


def test_forget_subject_crypto_erases_their_items_in_a_restored_backup(
        url: str, tmp_path: Path) -> None:
    """A backup of both the store and the registry, restored after ``forget_subject`` and the
    erasure epoch: the item's key row is back, but it opens only under the retired master
    version, so the item does not open with the keyring the epoch left."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (saver, store):
        with tenant_scope("acme"):
            store.put(NS, KEY, {"text": "dana likes tea"})
            store.put(("user-erin-42", "memories"), KEY, {"text": "erin stays"})
            backup_item, backup_keys = _raw(store, NS, KEY), _key_rows(url)
        saver.forget_subject(DANA, tenants=["acme"], requested_by="dpo")
        assert len(_key_rows(url)) == 1                      # erin's
        with tenant_scope("acme"):
            assert store.get(NS, KEY) is None
        report = saver.rotate_keys(retire_old=True)
        assert report.retired and not report.problems
    _restore_key_rows(url, backup_keys)      # both halves of the backup put back
    with _pair(url, ring) as (saver, store):
        with tenant_scope("acme"):
            _put_back(store, NS, KEY, backup_item)
            with pytest.raises(TamperedDataError):
                store.get(NS, KEY)
            keys = saver.services.tenant_keys("acme")
            with pytest.raises(TamperedDataError):   # nor by hand, with the live keyring
                codec.open_item(keys, codec.item_aad(saver.services.database_id(), "acme",
                                                     NS, KEY), backup_item)


def test_a_put_after_another_process_deleted_the_item_opens(url: str, tmp_path: Path) -> None:
    """Process A caches the item's key; process B deletes the item (its key with it); A
    writes the item again with the key it cached. The put lands under a deleted key -- and
    is sealed again under the item's new key before it returns, so every process reads it."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (_a_saver, a), _pair(url, ring) as (_b_saver, b), \
            tenant_scope("acme"):
        a.put(NS, KEY, {"text": "v1"})
        assert b.get(NS, KEY).value == {"text": "v1"}   # type: ignore[union-attr]
        b.delete(NS, KEY)
        a.put(NS, KEY, {"text": "v2"})        # A's cached key is gone
        assert b.get(NS, KEY).value == {"text": "v2"}   # type: ignore[union-attr]
        assert a.get(NS, KEY).value == {"text": "v2"}   # type: ignore[union-attr]
        b.delete(NS, KEY)
        b.put(NS, KEY, {"text": "v3"})        # deleted and written again: A's cache is stale
        assert a.get(NS, KEY).value == {"text": "v3"}   # type: ignore[union-attr]
        assert len(_key_rows(url)) == 1


def test_async_puts_deletes_and_put_backs(url: str, tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")

    async def run() -> None:
        async with SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as saver, \
                SecureStore.afrom_url(url, saver=saver) as store, \
                SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as saver2, \
                SecureStore.afrom_url(url, saver=saver2) as other:
            with tenant_scope("acme"):
                await store.aput(NS, KEY, {"text": "v1"})
                old = (await store.inner.aget((tenant_tag("acme"), *NS), KEY))
                assert old is not None
                await other.adelete(NS, KEY)
                await store.aput(NS, KEY, {"text": "v2"})   # its cached key is gone
                item = await other.aget(NS, KEY)
                assert item is not None and item.value == {"text": "v2"}
                await other.adelete(NS, KEY)
                await store.inner.abatch([PutOp((tenant_tag("acme"), *NS), KEY, old.value)])
                with pytest.raises(TamperedDataError):
                    await store.aget(NS, KEY)

    asyncio.run(run())


def test_equality_filters_on_personal_values_still_run_in_the_inner_store(
        url: str, tmp_path: Path) -> None:
    """The blind index is taken after redaction (an e-mail as its public token); a filter on
    the e-mail is redacted the same way, so it still meets the item -- and only it."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (_saver, store), tenant_scope("acme"):
        store.put(("people",), "d", {"email": "dana.person@example.com", "n": 1})
        store.put(("people",), "e", {"email": "erin.person@example.com", "n": 1})
        raw = _raw(store, ("people",), "d")
        keys = store.saver.services.tenant_keys("acme")
        assert codec.blind_value(keys, "email", "dana.person@example.com") not in raw.values()
        found = store.search(("people",), filter={"email": "dana.person@example.com"})
        assert [i.key for i in found] == ["d"]
        found = store.search(("people",), filter={"email": {"$eq": "erin.person@example.com"},
                                                  "n": 1})
        assert [i.key for i in found] == ["e"]
        assert store.search(("people",), filter={"email": "nobody@example.com"}) == []


def test_forget_subject_destroys_the_keys_of_items_the_store_already_expired(
        url: str, tmp_path: Path) -> None:
    """A TTL sweep deletes an item's row without SecureStore (its key row stays, and a copy
    of the row would open); ``forget_subject`` finds the keys of the subject's items by the
    subject's digest, not only through the rows the store still holds."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as (saver, store):
        with tenant_scope("acme"):
            store.put(NS, KEY, {"text": "dana likes tea"})
            store.put((DANA, "memories", "work"), "m2", {"text": "dana works late"})
            store.put(("user-erin-42", "memories"), KEY, {"text": "erin stays"})
            copy = _raw(store, NS, KEY)
            store.inner.batch([PutOp((tenant_tag("acme"), *NS), KEY, None)])   # "expired"
        assert len(_key_rows(url)) == 3
        erasure = saver.forget_subject(DANA, tenants=["acme"], requested_by="dpo")
        assert erasure.store_items == {"acme": 1}
        assert len(_key_rows(url)) == 1                                   # erin's
        with tenant_scope("acme"):
            assert store.get(("user-erin-42", "memories"), KEY) is not None
            _put_back(store, NS, KEY, copy)
            with pytest.raises(TamperedDataError):
                store.get(NS, KEY)
