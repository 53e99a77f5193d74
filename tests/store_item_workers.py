"""A process of a deployment sharing one SecureStore database, driven over a pipe by
``tests/test_store_item_processes.py``: it opens its own saver and store (its own key caches)
and runs the store operations it is sent."""

from __future__ import annotations

import random
from multiprocessing.connection import Connection
from typing import Any

from langgraph.store.base import PutOp

from langgraph_securesaver import Keyring, SecureSaver, SecureStore
from langgraph_securesaver.tenancy import tenant_scope, tenant_tag

NS = ("user-dana-17", "memories")


def _outcome(store: SecureStore, cmd: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", _run(store, cmd)
    except Exception as exc:  # the driver asserts on the type and message
        return "error", f"{type(exc).__name__}: {exc}"


def serve(url: str, ring: str, conn: Connection) -> None:
    """Answer ``(op, key, value)`` commands until ``("stop",)``; ``("loop", n, keys, seed)``
    runs n random puts, deletes and gets by itself (beside the other processes)."""
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(url, saver=saver) as store, tenant_scope("acme"):
        conn.send(("ready", None))
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            conn.send(_outcome(store, cmd))


def _run(store: SecureStore, cmd: tuple[Any, ...]) -> Any:
    op = cmd[0]
    if op == "put":
        return store.put(NS, cmd[1], cmd[2])
    if op == "delete":
        return store.delete(NS, cmd[1])
    if op == "get":
        return _value(store, cmd[1])
    if op == "raw":      # the inner store's row, as a database writer reads it
        item = store.inner.get((tenant_tag("acme"), *NS), cmd[1])
        return None if item is None else item.value
    if op == "putback":  # ... and writes it back, past SecureStore
        store.inner.batch([PutOp((tenant_tag("acme"), *NS), cmd[1], cmd[2])])
        return None
    return _loop(store, *cmd[1:])


def _value(store: SecureStore, key: str) -> Any:
    item = store.get(NS, key)
    return None if item is None else item.value


def _loop(store: SecureStore, n: int, keys: list[str], seed: int) -> dict[str, list[str]]:
    """n random operations; returns the errors met, by kind of operation (a read that fails
    while other processes churn the item counts as a get's, whatever the operation)."""
    rng = random.Random(seed)
    errors: dict[str, list[str]] = {"put": [], "delete": [], "get": []}
    for i in range(n):
        key = rng.choice(keys)
        op = rng.random()
        kind = "put" if op < 0.45 else "delete" if op < 0.7 else "get"
        try:
            if kind == "put":
                store.put(NS, key, {"by": seed, "i": i})
                store.get(NS, key)    # what it wrote opens (or is gone/overwritten meanwhile)
            elif kind == "delete":
                store.delete(NS, key)
            else:
                store.get(NS, key)
        except Exception as exc:  # collected for the driver
            errors["get" if type(exc).__name__ == "ItemChangedError" else kind].append(
                f"{type(exc).__name__}: {exc}")
    return errors
