"""``securesaver recover`` as a function: open the database at a URL with a SecureSaver, load
the graph, and run one stalled-run recovery sweep (:mod:`..idempotency.recovery` does the
sweep; this module only opens what it needs, which is why it sits above the saver).
"""

from __future__ import annotations

import logging
from typing import Any

from ..idempotency.recovery import (
    DeadLetter,
    RecoveryReport,
    arecover_stalled,
    async_url,
    dead_letters_of,
    load_graph,
    rearm_dead_letter,
    recover_stalled,
)
from ..offthread import to_thread
from ..saver import SecureSaver

logger = logging.getLogger("langgraph_securesaver.idempotency.recovery")


def recover_main(url: str, graph_ref: str, *, keyring: str | None = None,
                 older_than: float = 0.0, tenant: str | None = None, max_attempts: int = 3,
                 worker_id: str | None = None, lease: float = 300.0, limit: int | None = None,
                 durability: str = "sync", use_async: bool | None = None,
                 **saver_options: Any) -> RecoveryReport:
    """Entry point for ``securesaver recover``: one sweep over the database at ``url``.

    ``keyring`` is a keyring file path (default: ``SECURESAVER_MASTER_KEY``);
    ``saver_options`` go to ``SecureSaver.from_url`` (e.g. ``redaction=None``). An async URL
    (``sqlite+aiosqlite:///...``, ``postgresql+psycopg_async://...``) or ``use_async=True``
    opens the saver with ``SecureSaver.afrom_url`` (an async inner saver, as LangGraph Server
    uses) and sweeps with :func:`arecover_stalled`.
    """
    from ..keys.urls import load_provider
    plain = async_url(url)
    if plain is not None or use_async:
        import asyncio
        return asyncio.run(_arecover_main(
            plain or url, graph_ref, keyring=keyring, older_than=older_than, tenant=tenant,
            max_attempts=max_attempts, worker_id=worker_id, lease=lease, limit=limit,
            durability=durability, **saver_options))
    ring = load_provider(keyring)
    with SecureSaver.from_url(url, keyring=ring, **saver_options) as saver:
        graph = load_graph(graph_ref, saver)
        report = recover_stalled(graph, saver, older_than=older_than, tenant=tenant,
                                 max_attempts=max_attempts, worker_id=worker_id, lease=lease,
                                 limit=limit, durability=durability)
    _log_sweep(report)
    return report


async def _arecover_main(url: str, graph_ref: str, *, keyring: str | None, older_than: float,
                         tenant: str | None, max_attempts: int, worker_id: str | None,
                         lease: float, limit: int | None, durability: str,
                         **saver_options: Any) -> RecoveryReport:

    from ..keys.urls import load_provider
    ring = await to_thread(load_provider, keyring)
    async with SecureSaver.afrom_url(url, keyring=ring, **saver_options) as saver:
        graph = load_graph(graph_ref, saver)
        report = await arecover_stalled(graph, saver, older_than=older_than, tenant=tenant,
                                        max_attempts=max_attempts, worker_id=worker_id,
                                        lease=lease, limit=limit, durability=durability)
    _log_sweep(report)
    return report


def _log_sweep(report: RecoveryReport) -> None:
    logger.info("recovery sweep by %s: examined %s, resumed %s, failed %s, dead-lettered %s, "
                "yielded to the user's turn %s", report.worker_id, report.examined,
                len(report.resumed), len(report.failed), len(report.dead_lettered),
                len(report.yielded))


def dead_letters_main(url: str, *, keyring: str | None = None, tenant: str | None = None,
                      rearm: str | None = None, **saver_options: Any
                      ) -> tuple[list[DeadLetter], bool | None]:
    """``securesaver recover --dead-letters``: the dead letters at ``url`` (errors opened),
    and with ``rearm=THREAD`` (needs ``tenant``) whether that dead-lettered thread was
    re-armed for recovery."""
    from ..keys.urls import load_provider
    ring = load_provider(keyring)
    with SecureSaver.from_url(async_url(url) or url, keyring=ring, **saver_options) as saver:
        rearmed = None
        if rearm is not None:
            if tenant is None:
                from ..errors import ConfigurationError
                raise ConfigurationError("re-arming a dead letter needs --tenant")
            rearmed = rearm_dead_letter(saver, tenant, rearm)
        return dead_letters_of(saver, tenant=tenant), rearmed
