"""Store items are bound to their version (issue 43, "SecureStore keeps every promise
SecureSaver keeps"): an older sealed copy of a *live* item -- overwritten, not deleted -- put
back into the inner store by a database writer is refused, in the process that wrote it and in
every other, as a deleted item put back is.

And the rule that keeps LangGraph's own ``test_large_batches`` free of errors: an item this
very process is writing or deleting (another thread or task of it) reads as absent when what
the read met does not open, never as an error.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import PutOp

from langgraph_securesaver import Keyring, SecureSaver, SecureStore, TamperedDataError
from langgraph_securesaver.tenancy import tenant_scope, tenant_tag

DANA = "user-dana-17"
NS, KEY = (DANA, "memories"), "m1"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


@contextmanager
def _pair(url: str, ring: Path) -> Iterator[SecureStore]:
    """A store as one process of the deployment opens it (own key caches)."""
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(url, saver=saver) as store:
        yield store


def _raw(store: SecureStore, key: str = KEY) -> Any:
    item = store.inner.get((tenant_tag("acme"), *NS), key)
    assert item is not None
    return item.value


def _put_back(store: SecureStore, value: Any, key: str = KEY) -> None:
    """What a database writer does: the inner store's row, written past SecureStore."""
    store.inner.batch([PutOp((tenant_tag("acme"), *NS), key, value)])


def _value(store: SecureStore, key: str = KEY) -> Any:
    item = store.get(NS, key)
    return None if item is None else item.value


def test_an_older_copy_of_a_live_item_is_refused_in_every_process(url: str,
                                                                  tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as a, _pair(url, ring) as b, tenant_scope("acme"):
        a.put(NS, KEY, {"text": "v1"})
        v1 = _raw(a)
        assert _value(b) == {"text": "v1"}           # b caches the item's key
        a.put(NS, KEY, {"text": "v2"})
        v2 = _raw(a)
        assert _value(b) == {"text": "v2"}
        _put_back(a, v1)                              # rolled back by a database writer
        for store in (a, b):
            with pytest.raises(TamperedDataError):
                store.get(NS, KEY)
            with pytest.raises(TamperedDataError):
                store.search((DANA,))
        with _pair(url, ring) as c:                   # a process started later
            with pytest.raises(TamperedDataError):
                c.get(NS, KEY)
        _put_back(a, v2)                              # the current copy opens again
        assert _value(a) == _value(b) == {"text": "v2"}
        b.put(NS, KEY, {"text": "v3"})                # written by the other process
        assert _value(a) == {"text": "v3"}
        for older in (v1, v2):
            _put_back(b, older)
            for store in (a, b):
                with pytest.raises(TamperedDataError):
                    store.get(NS, KEY)


def test_a_copy_of_a_deleted_item_is_refused_by_a_process_that_cached_its_key(
        url: str, tmp_path: Path) -> None:
    """Each read checks the item's key row afresh: the key a process still caches does not
    open a copy of an item another process deleted (nor of one it deleted and wrote again)."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as a, _pair(url, ring) as b, tenant_scope("acme"):
        a.put(NS, KEY, {"text": "v1"})
        copy = _raw(a)
        assert _value(a) == {"text": "v1"}           # a caches the item's key
        b.delete(NS, KEY)
        _put_back(b, copy)
        with pytest.raises(TamperedDataError):
            a.get(NS, KEY)
        b.put(NS, KEY, {"text": "v2"})                # written again: a new key
        assert _value(a) == {"text": "v2"}
        _put_back(b, copy)
        with pytest.raises(TamperedDataError):
            a.get(NS, KEY)


def test_an_older_copy_of_a_live_item_is_refused_async(url: str, tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")

    async def run() -> None:
        async with SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as saver, \
                SecureStore.afrom_url(url, saver=saver) as store, \
                SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as saver2, \
                SecureStore.afrom_url(url, saver=saver2) as other:
            tag_ns = (tenant_tag("acme"), *NS)
            with tenant_scope("acme"):
                await store.aput(NS, KEY, {"text": "v1"})
                old = await store.inner.aget(tag_ns, KEY)
                assert old is not None
                got = await other.aget(NS, KEY)
                assert got is not None and got.value == {"text": "v1"}
                await other.aput(NS, KEY, {"text": "v2"})
                await store.inner.abatch([PutOp(tag_ns, KEY, old.value)])
                for one in (store, other):
                    with pytest.raises(TamperedDataError):
                        await one.aget(NS, KEY)
                    with pytest.raises(TamperedDataError):
                        await one.asearch((DANA,))
                await store.aput(NS, KEY, {"text": "v3"})
                got = await other.aget(NS, KEY)
                assert got is not None and got.value == {"text": "v3"}

    asyncio.run(run())


# one process, its threads and tasks on the same keys -----------------------------------------

KEYS = ["a", "b", "c"]
THREADS, ROUNDS = 6, 40


def _churn(store: SecureStore, seed: int, errors: list[str]) -> None:
    rng = random.Random(seed)
    with tenant_scope("acme"):
        for i in range(ROUNDS):
            key, op = rng.choice(KEYS), rng.random()
            try:
                if op < 0.4:
                    store.put(NS, key, {"by": seed, "i": i})
                elif op < 0.65:
                    store.delete(NS, key)
                elif op < 0.85:
                    store.get(NS, key)
                else:
                    store.batch([PutOp(NS, key, {"by": seed, "i": i}),
                                 PutOp(NS, rng.choice(KEYS), None)])
                    store.search(NS)
            except Exception as exc:  # collected: the test asserts there are none
                errors.append(f"{type(exc).__name__}: {exc}")


def _settled(store: SecureStore) -> dict[str, Any]:
    with tenant_scope("acme"):
        return {k: _value(store, k) for k in KEYS}


def test_threads_of_one_process_put_get_and_delete_the_same_items(url: str,
                                                                  tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _pair(url, ring) as store:
        errors: list[str] = []
        threads = [threading.Thread(target=_churn, args=(store, seed, errors))
                   for seed in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        final = _settled(store)
        assert _settled(store) == final                  # it stays what it is
        with _pair(url, ring) as other:                  # and every process agrees
            assert _settled(other) == final
        with tenant_scope("acme"):
            found = {i.key: i.value for i in store.search(NS)}
        assert found == {k: v for k, v in final.items() if v is not None}


def test_tasks_of_one_process_put_get_and_delete_the_same_items(url: str,
                                                                tmp_path: Path) -> None:
    ring = Keyring.generate().save(tmp_path / "keyring.json")

    async def churn(store: SecureStore, seed: int, errors: list[str]) -> None:
        rng = random.Random(seed)
        for i in range(ROUNDS):
            key, op = rng.choice(KEYS), rng.random()
            try:
                if op < 0.4:
                    await store.aput(NS, key, {"by": seed, "i": i})
                elif op < 0.65:
                    await store.adelete(NS, key)
                elif op < 0.85:
                    await store.aget(NS, key)
                else:
                    await store.abatch([PutOp(NS, key, {"by": seed, "i": i}),
                                        PutOp(NS, rng.choice(KEYS), None)])
                    await store.asearch(NS)
            except Exception as exc:  # collected: the test asserts there are none
                errors.append(f"{type(exc).__name__}: {exc}")

    async def run() -> dict[str, Any]:
        async with SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as saver, \
                SecureStore.afrom_url(url, saver=saver) as store:
            errors: list[str] = []
            with tenant_scope("acme"):
                await asyncio.gather(*(churn(store, seed, errors) for seed in range(THREADS)))
                assert errors == []
                final = {}
                for k in KEYS:
                    item = await store.aget(NS, k)
                    final[k] = None if item is None else item.value
                again = {}
                for k in KEYS:
                    item = await store.aget(NS, k)
                    again[k] = None if item is None else item.value
                assert again == final
            return final

    final = asyncio.run(run())
    with _pair(url, ring) as other:
        assert _settled(other) == final
