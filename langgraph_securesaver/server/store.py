"""SecureStore as LangGraph Server's long-term memory store (``"store": {"path": ...}``).

In ``langgraph.json``::

    "store": {"path": "langgraph_securesaver.server.store.store"}

or a file with ``store = make_store(...)`` (``"path": "./store.py:store"``). The server calls
``store()`` once per event-loop thread and enters the async context manager it returns; the
:class:`SecureStore` it yields acts for the tenant of the authenticated user of each request or
run (``tenant_of``, the checkpointer's rule: :class:`.saver.AuthTenantSaver`). Calls with no
user use ``SECURESAVER_DEFAULT_TENANT`` or raise :class:`TenantRequired`.

Configured like the checkpointer (``SECURESAVER_URL``, the keyring, ``SECURESAVER_REDACTION``,
``SECURESAVER_TENANT_FIELD``, ``SECURESAVER_DEFAULT_TENANT``); ``SECURESAVER_STORE_URL`` puts
the items in another database (default: the checkpointer's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..storage.backends import registry_url_for
from ..store import SecureStore
from ..store.inner_stores import open_async_store
from .encryption import mark_store_sealed
from .saver import AuthTenantSaver, ServerSettings, TenantOf, tenant_from_field

logger = logging.getLogger(__name__)


def make_store(*, tenant_of: TenantOf | None = None, settings: ServerSettings | None = None,
               url: str | None = None, ttl: Any = None, **store_options: Any
               ) -> Callable[[], Any]:
    """A ``store`` for langgraph.json: a callable returning an async context manager that
    opens a :class:`SecureStore` (set up) whose tenant is the server's authenticated user.

    Args:
        tenant_of: user -> tenant id (default: the user's ``identity``, or
            ``SECURESAVER_TENANT_FIELD``).
        settings: instead of reading the environment when the server opens the store.
        url: the store's database (default ``SECURESAVER_STORE_URL``, else
            ``SECURESAVER_URL``).
        ttl: LangGraph's ``TTLConfig`` for the inner store.
        store_options: SecureStore's ``index`` / ``blind_index``.
    """
    @asynccontextmanager
    async def store() -> AsyncIterator[SecureStore]:
        cfg = settings or ServerSettings.from_env()
        where = url or os.environ.get("SECURESAVER_STORE_URL", "").strip() or cfg.url
        resolve = tenant_of or tenant_from_field(cfg.tenant_field)
        options: dict[str, Any] = {"default_tenant": cfg.default_tenant}
        if not cfg.redaction:
            options["redaction"] = None
        from langgraph.checkpoint.memory import InMemorySaver
        # the store's keys, tenant rules, redactor and vault: a saver that never stores a
        # checkpoint, on the store's database
        saver = AuthTenantSaver(InMemorySaver(), keyring=cfg.keyring,
                                registry=registry_url_for(where), tenant_of=resolve, **options)
        try:
            async with open_async_store(where, ttl) as inner:
                opened = SecureStore(inner, saver=saver, **store_options)
                await opened.asetup()
                mark_store_sealed()   # the encryption handlers leave store values to it
                logger.info("SecureStore for LangGraph Server (tenant from %s)",
                            getattr(resolve, "__name__", "tenant_of"))
                yield opened
        finally:
            import asyncio
            await asyncio.to_thread(saver.registry.dispose)
    return store


store = make_store()
"""The defaults: ``"path": "langgraph_securesaver.server.store.store"`` in langgraph.json."""
