"""The evidence methods of :class:`~langgraph_securesaver.SecureSaver` (a base class of it):
exporting what the library holds about one person, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any, cast

from ..offthread import to_thread
from ..services import SaverLike, SaverServices
from . import export


class EvidenceOperations:
    """``export_subject`` and ``aexport_subject``."""

    services: SaverServices

    def export_subject(self, subject_id: str, *, tenants: Any = None,
                       out: IO[str] | None = None) -> dict[str, Any]:
        """Everything this saver's database holds about one person (the *subject*, as
        ``forget_subject`` names them), in ``tenants`` (None: every tenant; inside a scope,
        that tenant only): each thread's checkpoints (messages and state, personal data
        restored), pending interrupts, retention, idempotency records and deletion receipts,
        and the subject's store items; nothing of anyone else.

        Without ``out`` the document is returned as a dict. With ``out`` (a text stream) it
        is written there while it is read, memory staying flat however long the history,
        and the counts are returned. Format: :mod:`langgraph_securesaver.evidence.export`.
        """
        return export.export_subject(cast("SaverLike", self), subject_id, tenants=tenants,
                                     out=out)

    async def aexport_subject(self, subject_id: str, *, tenants: Any = None,
                              out: IO[str] | None = None) -> dict[str, Any]:
        """Async twin of :meth:`export_subject`, run in a worker thread (an async-only inner
        saver is read with ``alist`` on this event loop, one checkpoint at a time)."""
        saver = cast("SaverLike", self)
        read = None
        if self.services.async_only:
            loop = asyncio.get_running_loop()
            alist = saver.alist  # type: ignore[attr-defined]

            def read(config: Any, **options: Any) -> Iterator[Any]:
                return _pulled(alist(config, **options), loop)
        return await to_thread(lambda: export.export_subject(
            saver, subject_id, tenants=tenants, out=out, read=read))


def _pulled(items: AsyncIterator[Any], loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    """An async iterator driven on ``loop`` from a worker thread, one item at a time."""
    iterator = items.__aiter__()
    try:
        while True:
            try:
                yield asyncio.run_coroutine_threadsafe(
                    iterator.__anext__(), loop).result()  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        closing = getattr(iterator, "aclose", None)
        if closing is not None:
            asyncio.run_coroutine_threadsafe(closing(), loop).result()
