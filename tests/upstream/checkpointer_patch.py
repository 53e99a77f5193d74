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
    from langgraph_securesaver.registry import Registry

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
