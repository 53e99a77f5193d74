"""Opening a SecureSaver on a database URL: ``from_url`` / ``afrom_url`` and the
``from_conn_string`` names LangGraph's own savers use.

A base class of :class:`~langgraph_securesaver.SecureSaver`, so the constructors list every
constructor option by name (type checkers and IDEs see them) without growing the saver class.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .errors import KeyringRequired
from .keys.keyring import Keyring
from .keys.provider import KeyProvider
from .keys.urls import is_provider_url, provider_from_url
from .offthread import to_thread

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol

    from .retention import RetentionPolicy

#: what ``keyring=`` accepts: a provider, a keyring file path, or None (the environment)
KeyringArg = KeyProvider | str | os.PathLike[str] | None


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: "Use the default policy" (redaction on), distinct from ``None`` (off).
DEFAULT: Any = _Default()

def _keyring_of(keyring: KeyringArg) -> Any:
    """A provider for ``keyring=``: a path is loaded as a keyring file (mode and owner
    checked), None reads the environment."""
    if isinstance(keyring, str) and is_provider_url(keyring):
        return provider_from_url(keyring)
    if isinstance(keyring, (str, os.PathLike)):
        return Keyring.from_file(keyring)
    if keyring is None:
        try:
            return Keyring.from_env()
        except KeyringRequired:
            raise KeyringRequired() from None
    return keyring


S = TypeVar("S", bound="UrlConstructors")


class UrlConstructors:
    """``from_url`` / ``afrom_url`` (and their ``from_conn_string`` aliases) for a saver class
    whose constructor takes ``(inner, *, keyring, registry, **options)``."""

    @classmethod
    @contextmanager
    def from_url(cls: type[S], url: str, *, keyring: KeyringArg = None,
                 redaction: Any = DEFAULT, retention: RetentionPolicy | None = None,
                 default_tenant: str | None = None,
                 metadata_allowlist: frozenset[str] | set[str] | None = None,
                 blind_index: bool = True, activity_resolution: float = 60.0,
                 serde: SerializerProtocol | None = None,
                 thread_keys: bool = True) -> Iterator[S]:
        """A saver on one database (inner saver + registry), set up and ready; closed on exit.

        Args:
            url: ``sqlite:///path.db`` (or ``sqlite:///:memory:``), ``postgresql://...``
                (the ``postgres`` extra) or ``mysql://...`` (the ``mysql`` extra). The inner
                saver is ``SqliteSaver``, ``PostgresSaver`` on a psycopg pool or LangGraph's
                ``PyMySQLSaver``; the registry lives in the same database.
            keyring: a :class:`~langgraph_securesaver.Keyring`, any ``KeyProvider``, or a
                keyring file's path; ``None`` reads ``SECURESAVER_MASTER_KEY``.
            redaction: a ``Redactor``, the default policy (omit it), or ``None`` for off.
            retention: the default :class:`~langgraph_securesaver.RetentionPolicy`.
            default_tenant: the tenant for calls that name none.
            metadata_allowlist: metadata keys stored in clear.
            blind_index: keyed HMAC index for equality filters on protected metadata.
            activity_resolution: seconds between registry updates of a thread's activity.
            serde: how values are serialized before encryption (``JsonPlusSerializer``).
            thread_keys: seal each thread (and PII-vault value) under its own data key,
                destroyed when it is deleted (``False``: the tenant data key only).

        Raises:
            KeyringMismatch: the database was created with another keyring.
        """
        from .storage.backends import binary_thread_ids, is_mysql, open_sync_inner
        keyring = _keyring_of(keyring)     # refused before the database is opened
        with open_sync_inner(url) as (inner, registry_url):
            saver: Any = cast(Any, cls)(
                inner, keyring=keyring, registry=registry_url, redaction=redaction,
                retention=retention, default_tenant=default_tenant,
                metadata_allowlist=metadata_allowlist, blind_index=blind_index,
                activity_resolution=activity_resolution, serde=serde,
                thread_keys=thread_keys)
            saver.setup()
            if is_mysql(url):
                binary_thread_ids(saver.registry.engine)
            try:
                yield saver
            finally:
                saver.registry.dispose()

    @classmethod
    @asynccontextmanager
    async def afrom_url(cls: type[S], url: str, *, keyring: KeyringArg = None,
                        redaction: Any = DEFAULT, retention: RetentionPolicy | None = None,
                        default_tenant: str | None = None,
                        metadata_allowlist: frozenset[str] | set[str] | None = None,
                        blind_index: bool = True, activity_resolution: float = 60.0,
                        serde: SerializerProtocol | None = None,
                        thread_keys: bool = True) -> AsyncIterator[S]:
        """Async twin of :meth:`from_url`: ``AsyncSqliteSaver`` (``aiosqlite``),
        ``AsyncPostgresSaver`` or ``AsyncMySaver`` (``asyncmy``) inside, set up without
        blocking the event loop; the same parameters."""
        from .storage.backends import binary_thread_ids, is_mysql, open_async_inner
        keyring = await to_thread(_keyring_of, keyring)
        async with open_async_inner(url) as (inner, registry_url):
            saver: Any = cast(Any, cls)(
                inner, keyring=keyring, registry=registry_url, redaction=redaction,
                retention=retention, default_tenant=default_tenant,
                metadata_allowlist=metadata_allowlist, blind_index=blind_index,
                activity_resolution=activity_resolution, serde=serde,
                thread_keys=thread_keys)
            await saver.asetup()
            if is_mysql(url):
                await to_thread(binary_thread_ids, saver.registry.engine)
            try:
                yield saver
            finally:
                await to_thread(saver.registry.dispose)

    #: The name LangGraph's savers use for :meth:`from_url` (same URL, same parameters).
    from_conn_string = from_url
    #: The name LangGraph's async savers use for :meth:`afrom_url`.
    afrom_conn_string = afrom_url
