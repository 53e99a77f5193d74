"""Third-party savers, raw: how the tests open each one on a fresh backend.

langgraph-checkpoint-mysql (PyMySQLSaver; AsyncMySaver over asyncmy) on MariaDB,
langgraph-checkpoint-plainredis (RedisSaver, AsyncRedisSaver) on Redis, langgraph-checkpoint-lmdb
(LMDBSaver, AsyncLMDBSaver) and langgraph-checkpoint-objectstorage (ObjectStorageSaver with its
own AES-GCM encryption on, which SecureSaver requires: docs/savers.md) on local files.

``open_saver(name, ...)`` is an async context manager yielding ``(inner, backend)``; the
backend can dump every stored byte (``dump()``) and overwrite stored values (``rewrite``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (saver name, async?) pairs the tests parametrize over
SAVERS = ["mysql", "mysql-async", "redis", "redis-async", "lmdb", "lmdb-async", "objectstorage"]
ASYNC_ONLY = {"mysql-async", "redis-async", "lmdb-async"}
OS_KEY = b"k" * 32


class StaticKey:
    """ObjectStorageSaver's KeyProvider: one AES-256 key."""

    def get_key(self, thread_id: str, key_id: str | None = None) -> tuple[str, bytes]:
        return "k1", OS_KEY


@dataclass
class Backend:
    """What a test may do to the storage under a saver."""

    dump: Callable[[], bytes]
    files: Path | None = None
    redis: Any = None
    mysql_url: str | None = None


def _mysql_rows(url: str) -> bytes:
    from urllib.parse import urlsplit

    import pymysql
    u = urlsplit(url)
    conn = pymysql.connect(host=u.hostname, port=u.port, user=u.username or "root",
                           database=u.path.lstrip("/"))
    out = b""
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            for (table,) in cur.fetchall():
                cur.execute(f"SELECT * FROM `{table}`")
                for row in cur.fetchall():
                    out += repr(row).encode() + b"\n"
                    for v in row:
                        if isinstance(v, (bytes, bytearray)):
                            out += bytes(v)
                        elif isinstance(v, str):
                            out += v.encode()
    finally:
        conn.close()
    return out


def _files_bytes(root: Path) -> bytes:
    out = b""
    for f in sorted(root.rglob("*")):
        if f.is_file():
            out += str(f).encode() + f.read_bytes()
    return out


def _redis_bytes(client: Any) -> bytes:
    out = b""
    for key in client.scan_iter("*"):
        out += key
        kind = client.type(key)
        if kind == b"string":
            out += client.get(key) or b""
        elif kind == b"hash":
            for k, v in client.hgetall(key).items():
                out += k + v
        elif kind == b"zset":
            for m in client.zrange(key, 0, -1):
                out += m
        elif kind == b"set":
            for m in client.smembers(key):
                out += m
        elif kind == b"list":
            for m in client.lrange(key, 0, -1):
                out += m
    return out


@contextlib.asynccontextmanager
async def open_saver(name: str, *, tmp: Path, mariadb: Any = None, redis_server: Any = None
                     ) -> AsyncIterator[tuple[Any, Backend]]:
    """The raw saver ``name`` on a fresh backend, set up."""
    if name in ("mysql", "mysql-async"):
        url = mariadb.new_database()
        if name == "mysql":
            from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver
            with PyMySQLSaver.from_conn_string(url) as saver:
                saver.setup()
                yield saver, Backend(lambda: _mysql_rows(url), mysql_url=url)
        else:
            from langgraph.checkpoint.mysql.asyncmy import AsyncMySaver
            async with AsyncMySaver.from_conn_string(
                    url.replace("mysql://", "mysql+asyncmy://")) as saver:
                await saver.setup()
                yield saver, Backend(lambda: _mysql_rows(url), mysql_url=url)
        return
    if name in ("redis", "redis-async"):
        import redis
        client = redis.Redis(port=redis_server.port)
        prefix = f"t{uuid.uuid4().hex[:8]}"
        if name == "redis":
            from langgraph_checkpoint_plainredis import RedisSaver
            saver = RedisSaver(url=redis_server.url, prefix=prefix)
        else:
            from langgraph_checkpoint_plainredis import AsyncRedisSaver
            saver = AsyncRedisSaver(url=redis_server.url, prefix=prefix)

        def dump() -> bytes:
            return _redis_bytes(client)
        try:
            yield saver, Backend(dump, redis=client)
        finally:
            client.close()
        return
    if name in ("lmdb", "lmdb-async"):
        import lmdb
        from langgraph_checkpoint_lmdb import AsyncLMDBSaver, LMDBSaver
        path = tmp / f"lmdb-{uuid.uuid4().hex[:8]}"
        env = lmdb.open(str(path), max_dbs=8, map_size=1 << 26)
        saver = LMDBSaver(env) if name == "lmdb" else AsyncLMDBSaver(env)
        try:
            yield saver, Backend(lambda: _files_bytes(path), files=path)
        finally:
            env.close()
        return
    if name == "objectstorage":
        from fsspec.implementations.local import LocalFileSystem
        from langgraph_checkpoint_objectstorage import ObjectStorageSaver
        root = tmp / f"objects-{uuid.uuid4().hex[:8]}"
        root.mkdir()
        yield (ObjectStorageSaver(LocalFileSystem(), str(root), encryption=StaticKey()),
               Backend(lambda: _files_bytes(root), files=root))
        return
    raise ValueError(name)


def ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
