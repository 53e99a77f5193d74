"""Imported by the patched upstream store tests (tests/upstream/run_store_suite.py).

``wrap_module(globals())`` rebinds the store classes a test module imported
(``InMemoryStore``, ``SqliteStore``, ``AsyncSqliteStore``, ``PostgresStore``,
``AsyncPostgresStore``) to factories with the same construction API (``Cls(...)``,
``Cls.from_conn_string(...)``, class attributes such as ``MIGRATIONS``) that return the raw
store -- built *without* ``index`` -- wrapped in a SecureStore with default settings (redaction
on) plus a fresh keyring and a default tenant; ``index`` goes to SecureStore, which embeds the
redacted text itself. The registry lives with the items: the same SQLite file, the same
PostgreSQL database, or memory (in-memory stores and stores built from a bare connection).
"""

from __future__ import annotations

from contextlib import asynccontextmanager, contextmanager
from typing import Any

from langgraph_securesaver import Keyring, SecureStore
from langgraph_securesaver.registry.core import Registry

NAMES = ("InMemoryStore", "SqliteStore", "AsyncSqliteStore", "PostgresStore",
         "AsyncPostgresStore")


class _HarnessStore(SecureStore):
    """SecureStore plus what upstream tests touch on the store object itself."""

    @property
    def MIGRATIONS(self) -> Any:
        return self.inner.MIGRATIONS  # type: ignore[attr-defined]

    @MIGRATIONS.setter
    def MIGRATIONS(self, value: Any) -> None:
        self.inner.MIGRATIONS = value  # type: ignore[attr-defined]


    def _cursor(self, *args: Any, **kwargs: Any) -> Any:
        """The inner store's cursor: upstream fixtures run their migration checks with it."""
        return self.inner._cursor(*args, **kwargs)  # type: ignore[attr-defined]


class _AsyncHarnessStore(_HarnessStore):
    async def setup(self) -> None:  # type: ignore[override]  # the async stores' setup
        await self.asetup()


def _registry_for(real: type, conn_string: str | None) -> Registry | None:
    if conn_string is None:
        return None
    if "Postgres" in real.__name__:
        return Registry(conn_string.replace("postgres://", "postgresql://", 1))
    if conn_string in (":memory:", ""):
        return Registry.in_memory()
    return Registry(f"sqlite:///{conn_string}")


#: one keyring per database, as a deployment has: upstream fixtures open the same database
#: more than once (set up and migrate, then the test's store), and the registry that the
#: first opening created is bound to its keyring
_KEYRINGS: dict[str, Keyring] = {}


def _keyring_for(conn_string: str | None) -> Keyring:
    if conn_string is None or conn_string in (":memory:", ""):
        return Keyring.generate()
    if conn_string not in _KEYRINGS:
        _KEYRINGS[conn_string] = Keyring.generate()
    return _KEYRINGS[conn_string]


def _secure(real: type, inner: Any, index: Any, conn_string: str | None) -> SecureStore:
    cls = _AsyncHarnessStore if real.__name__.startswith("Async") else _HarnessStore
    registry = _registry_for(real, conn_string)
    if registry is None and real.__name__ != "InMemoryStore":
        registry = Registry.in_memory()
    return cls(inner, keyring=_keyring_for(conn_string), default_tenant="t",
               registry=registry, index=index)


def wrap(real: type) -> type:
    def __new__(cls: type, *args: Any, index: Any = None, **kwargs: Any) -> Any:
        return _secure(real, real(*args, **kwargs), index, None)

    namespace: dict[str, Any] = {"__new__": __new__, "__module__": real.__module__}
    if hasattr(real, "from_conn_string"):
        if real.__name__.startswith("Async"):
            @asynccontextmanager
            async def from_conn_string(conn_string: str, *, index: Any = None,
                                       **kwargs: Any) -> Any:
                async with real.from_conn_string(conn_string, **kwargs) as inner:
                    store = _secure(real, inner, index, conn_string)
                    try:
                        yield store
                    finally:
                        store.saver.registry.dispose()
        else:
            @contextmanager
            def from_conn_string(conn_string: str, *, index: Any = None,
                                 **kwargs: Any) -> Any:
                with real.from_conn_string(conn_string, **kwargs) as inner:
                    store = _secure(real, inner, index, conn_string)
                    try:
                        yield store
                    finally:
                        store.saver.registry.dispose()
        namespace["from_conn_string"] = staticmethod(from_conn_string)
    return type(real.__name__, (real,), namespace)


def wrap_module(module_globals: dict[str, Any]) -> None:
    for name in NAMES:
        real = module_globals.get(name)
        if isinstance(real, type):
            module_globals[name] = wrap(real)
