"""The heartbeat of an idempotency store: one daemon thread per store renewing the leases of
the claims whose effects still run (and pinging the PostgreSQL session lock).

Knows a store only as something that renews a claim; nothing of SQL or results.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from .errors import IdempotencyStoreUnavailable
from .records import Claim

logger = logging.getLogger("langgraph_securesaver.idempotency.store")


class _Renewer(Protocol):
    @property
    def pg_session(self) -> Any: ...

    def renew(self, claim: Claim) -> bool: ...


class _Heartbeat:
    """One daemon thread per store renewing the leases of the claims whose effects still run."""

    def __init__(self, store: _Renewer) -> None:
        self._store = store
        self._claims: dict[str, tuple[Claim, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def track(self, claim: Claim) -> Iterator[None]:
        with self._lock:
            self._claims[claim.claim_id] = (claim, time.monotonic() + claim.lease / 3)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="securesaver-idem-lease",
                                                daemon=True)
                self._thread.start()
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._claims.pop(claim.claim_id, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._claims:
                    self._thread = None
                    return
                now = time.monotonic()
                due = [c for c, at in self._claims.values() if at <= now]
                wait = min(at for _c, at in self._claims.values()) - now
            if due and self._store.pg_session is not None:
                self._store.pg_session.ping()
            for claim in due:
                try:
                    ok = self._store.renew(claim)
                except IdempotencyStoreUnavailable:
                    logger.warning("could not renew the lease of %s (store unavailable)",
                                   claim.scope.key)
                    ok = True  # try again next round; the lease may still be valid
                with self._lock:
                    if claim.claim_id in self._claims:
                        self._claims[claim.claim_id] = (claim, time.monotonic() + claim.lease / 3)
                if not ok:
                    logger.warning("lease of idempotency key %s was lost (taken over)",
                                   claim.scope.key)
            self._wake.wait(timeout=max(0.01, wait) if not due else 0.01)
            self._wake.clear()
