# --- appended by langgraph-securesaver's upstream harness (tests/upstream/run_langgraph_suite.py) ---
# SecureSaver variants over the raw savers defined above.  Each variant is the raw fixture's own
# context manager (PostgreSQL: the same saver in a fresh schema per test instead of a fresh
# database), wrapped with default settings (redaction on) plus a fresh keyring and a default
# tenant; the registry lives with the checkpoints (in memory for the in-memory and ":memory:"
# SQLite savers, the per-test PostgreSQL schema otherwise).
import os as _ss_os

DEFAULT_POSTGRES_URI = _ss_os.environ.get("LG_POSTGRES_URI", DEFAULT_POSTGRES_URI)  # noqa: F821


def _ss_secure(inner, registry=None):
    from langgraph_securesaver import Keyring, SecureSaver

    return SecureSaver(inner, keyring=Keyring.generate(), default_tenant="t", registry=registry)


@contextmanager  # noqa: F821
def _ss_pg_schema_uri():
    """A fresh schema per test in one database (upstream creates a database per test, which
    costs seconds each on a busy machine); the saver's search_path points at it."""
    from urllib.parse import quote

    schema = "lgss_" + uuid4().hex[:16]  # noqa: F821
    with Connection.connect(DEFAULT_POSTGRES_URI, autocommit=True) as conn:  # noqa: F821
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in DEFAULT_POSTGRES_URI else "?"
    try:
        yield f"{DEFAULT_POSTGRES_URI}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with Connection.connect(DEFAULT_POSTGRES_URI, autocommit=True) as conn:  # noqa: F821
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager  # noqa: F821
def _checkpointer_postgres_schema():
    with _ss_pg_schema_uri() as uri, PostgresSaver.from_conn_string(uri) as saver:  # noqa: F821
        saver.setup()
        yield saver


@asynccontextmanager  # noqa: F821
async def _checkpointer_postgres_aio_schema():
    with _ss_pg_schema_uri() as uri:
        async with AsyncPostgresSaver.from_conn_string(uri) as saver:  # noqa: F821
            await saver.setup()
            yield saver


@contextmanager  # noqa: F821
def _checkpointer_secure_memory():
    with _checkpointer_memory() as inner:  # noqa: F821
        yield _ss_secure(inner)


@contextmanager  # noqa: F821
def _checkpointer_secure_plain_memory():
    # over a plain InMemorySaver (MemorySaverAssertImmutable compares raw stored bytes)
    from langgraph.checkpoint.memory import InMemorySaver

    yield _ss_secure(InMemorySaver())


@contextmanager  # noqa: F821
def _checkpointer_secure_sqlite():
    with _checkpointer_sqlite() as inner:  # noqa: F821
        saver = _ss_secure(inner)
        saver.setup()
        try:
            yield saver
        finally:
            saver.registry.dispose()


@contextmanager  # noqa: F821
def _checkpointer_secure_postgres():
    with _ss_pg_schema_uri() as uri, PostgresSaver.from_conn_string(uri) as inner:  # noqa: F821
        inner.setup()
        saver = _ss_secure(inner, registry=uri)
        saver.setup()
        try:
            yield saver
        finally:
            saver.registry.dispose()  # before the schema is dropped


@asynccontextmanager  # noqa: F821
async def _checkpointer_secure_sqlite_aio():
    from langgraph_securesaver.registry.core import Registry

    async with _checkpointer_sqlite_aio() as inner:  # noqa: F821
        saver = _ss_secure(inner, registry=Registry.in_memory())
        await saver.asetup()
        try:
            yield saver
        finally:
            saver.registry.dispose()


@asynccontextmanager  # noqa: F821
async def _checkpointer_secure_postgres_aio():
    with _ss_pg_schema_uri() as uri:
        async with AsyncPostgresSaver.from_conn_string(uri) as inner:  # noqa: F821
            await inner.setup()
            saver = _ss_secure(inner, registry=uri)
            await saver.asetup()
            try:
                yield saver
            finally:
                saver.registry.dispose()


SS_SYNC_CKPTS = {
    "memory": _checkpointer_memory,  # noqa: F821
    "sqlite": _checkpointer_sqlite,  # noqa: F821
    "postgres": _checkpointer_postgres,  # noqa: F821
    "postgres_schema": _checkpointer_postgres_schema,
    "secure_memory": _checkpointer_secure_memory,
    "secure_plain_memory": _checkpointer_secure_plain_memory,
    "secure_sqlite": _checkpointer_secure_sqlite,
    "secure_postgres": _checkpointer_secure_postgres,
}
SS_ASYNC_CKPTS = {
    "memory": _checkpointer_memory,  # noqa: F821
    "sqlite_aio": _checkpointer_sqlite_aio,  # noqa: F821
    "postgres_aio": _checkpointer_postgres_aio,  # noqa: F821
    "postgres_aio_schema": _checkpointer_postgres_aio_schema,
    "secure_memory": _checkpointer_secure_memory,
    "secure_plain_memory": _checkpointer_secure_plain_memory,
    "secure_sqlite_aio": _checkpointer_secure_sqlite_aio,
    "secure_postgres_aio": _checkpointer_secure_postgres_aio,
}


# --- tenancy modes (SS_TENANCY, set by run_langgraph_suite.py --tenancy) ----------------------
# "default": default_tenant="t" (above). "scope": no default tenant; conftest_patch.py runs every
# test inside tenant_scope("t"). "config": no default tenant; the tenant only in the
# configurable of the configs the tests pass: a graph entry point or checkpointer method called
# *from test code* (a file of this tests directory) gets "tenant_id": "t" added to its config;
# configs LangGraph builds itself are never touched. The checkpointer methods that take no
# config (delete_thread, copy_thread, prune, delete_for_runs) can name no tenant that way; called
# from test code they run inside tenant_scope("t").
SS_TENANCY = _ss_os.environ.get("SS_TENANCY", "default")
_SS_TESTS_DIR = _ss_os.path.dirname(_ss_os.path.abspath(__file__)) + _ss_os.sep


def _ss_from_tests(depth: int = 2) -> bool:
    """Whether the call comes from test code: its caller is a file of the tests directory,
    or no LangGraph/LangChain frame is on the stack at all (a test that hands its config to
    another thread, e.g. ``asyncio.to_thread(graph.get_state, config)``)."""
    import sys

    frame = sys._getframe(depth)
    if frame.f_code.co_filename.startswith(_SS_TESTS_DIR):
        return True
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("langgraph.", "langchain_core.")):
            return False
        frame = frame.f_back
    return True


def _ss_with_tenant(config):
    """The config with tenant_id "t" when it addresses a thread (configs without a thread id
    are left alone: giving them a configurable would change what LangGraph does with them)."""
    conf = (config or {}).get("configurable") or {}
    if "tenant_id" in conf or "thread_id" not in conf:
        return config
    return {**config, "configurable": {**conf, "tenant_id": "t"}}


def _ss_config_saver_class():
    from langgraph_securesaver import SecureSaver, tenant_scope

    class ConfigModeSaver(SecureSaver):
        """SecureSaver whose methods add tenant_id to configs passed by test code only."""

        def get_tuple(self, config):
            return super().get_tuple(_ss_with_tenant(config) if _ss_from_tests() else config)

        async def aget_tuple(self, config):
            return await super().aget_tuple(
                _ss_with_tenant(config) if _ss_from_tests() else config)

        def get(self, config):
            return super().get(_ss_with_tenant(config) if _ss_from_tests() else config)

        async def aget(self, config):
            return await super().aget(_ss_with_tenant(config) if _ss_from_tests() else config)

        def list(self, config, *, filter=None, before=None, limit=None):
            if _ss_from_tests() and config is not None:
                config = _ss_with_tenant(config)
            return super().list(config, filter=filter, before=before, limit=limit)

        def alist(self, config, *, filter=None, before=None, limit=None):
            if _ss_from_tests() and config is not None:
                config = _ss_with_tenant(config)
            return super().alist(config, filter=filter, before=before, limit=limit)

        def put(self, config, checkpoint, metadata, new_versions):
            if _ss_from_tests():
                config = _ss_with_tenant(config)
            return super().put(config, checkpoint, metadata, new_versions)

        async def aput(self, config, checkpoint, metadata, new_versions):
            if _ss_from_tests():
                config = _ss_with_tenant(config)
            return await super().aput(config, checkpoint, metadata, new_versions)

        def put_writes(self, config, writes, task_id, task_path=""):
            if _ss_from_tests():
                config = _ss_with_tenant(config)
            return super().put_writes(config, writes, task_id, task_path)

        async def aput_writes(self, config, writes, task_id, task_path=""):
            if _ss_from_tests():
                config = _ss_with_tenant(config)
            return await super().aput_writes(config, writes, task_id, task_path)

    def scoped(name):
        method = getattr(SecureSaver, name)
        if name.startswith("a"):
            async def call(self, *args, **kwargs):
                if not _ss_from_tests():
                    return await method(self, *args, **kwargs)
                with tenant_scope("t"):
                    return await method(self, *args, **kwargs)
        else:
            def call(self, *args, **kwargs):
                if not _ss_from_tests():
                    return method(self, *args, **kwargs)
                with tenant_scope("t"):
                    return method(self, *args, **kwargs)
        call.__name__ = name
        return call

    for name in ("delete_thread", "copy_thread", "prune", "delete_for_runs"):
        setattr(ConfigModeSaver, name, scoped(name))
        setattr(ConfigModeSaver, "a" + name, scoped("a" + name))
    return ConfigModeSaver


def _ss_patch_graph_entry_points():
    """Graph entry points called from test code get the tenant in their config(s)."""
    import functools

    from langgraph.pregel import Pregel

    def wrap(name, position, many=False):
        method = getattr(Pregel, name)

        def fix(args, kwargs):
            if "config" in kwargs:
                value = kwargs["config"]
                kwargs["config"] = ([_ss_with_tenant(c) for c in value] if many
                                    and isinstance(value, list) else _ss_with_tenant(value))
            elif len(args) > position:
                value = args[position]
                fixed = ([_ss_with_tenant(c) for c in value] if many and isinstance(value, list)
                         else _ss_with_tenant(value))
                args = (*args[:position], fixed, *args[position + 1:])
            return args, kwargs

        if name.startswith("a") and name not in ("astream", "aget_state_history",
                                                 "astream_events"):
            @functools.wraps(method)
            async def call(self, *args, **kwargs):
                if _ss_from_tests():
                    args, kwargs = fix(args, kwargs)
                return await method(self, *args, **kwargs)
        else:
            @functools.wraps(method)
            def call(self, *args, **kwargs):
                if _ss_from_tests():
                    args, kwargs = fix(args, kwargs)
                return method(self, *args, **kwargs)
        setattr(Pregel, name, call)

    for name in ("invoke", "ainvoke", "stream", "astream", "astream_events"):
        wrap(name, 1)
    for name in ("batch", "abatch"):
        wrap(name, 1, many=True)
    for name in ("get_state", "aget_state", "get_state_history", "aget_state_history",
                 "update_state", "aupdate_state", "bulk_update_state", "abulk_update_state"):
        wrap(name, 0)


if SS_TENANCY in ("scope", "config"):
    def _ss_secure(inner, registry=None):  # the tenancy modes: no default tenant
        from langgraph_securesaver import Keyring

        cls = _ss_config_saver_class() if SS_TENANCY == "config" else None
        if cls is None:
            from langgraph_securesaver import SecureSaver as cls
        return cls(inner, keyring=Keyring.generate(), registry=registry)

if SS_TENANCY == "config":
    _ss_patch_graph_entry_points()
