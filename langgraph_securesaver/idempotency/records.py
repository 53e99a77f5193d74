"""The records of the idempotency store: a claim, a hit, the outcome of one call, what
operators see, and the row a claim decision is made from. Data only: the SQL lives in
:mod:`.statements`, the decisions in :mod:`.claiming` and :mod:`.store`, the lease heartbeat
in :mod:`.heartbeat`.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from .keys import KeyScope


@dataclass
class Claim:
    """This worker owns ``scope`` until its lease expires (``token`` is the fencing token)."""

    scope: KeyScope
    token: int
    attempts: int
    owner: str
    lease: float
    lost: bool = False
    claim_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # registered as running in this process (see liveness.register_running)
    registered: bool = field(default=False, repr=False, compare=False)


@dataclass(frozen=True)
class Hit:
    """The key is completed: ``value`` is the stored result."""

    scope: KeyScope
    value: Any
    token: int
    attempts: int


@dataclass(frozen=True)
class Outcome:
    """What :meth:`IdempotencyStore.execute` returns."""

    value: Any
    replayed: bool
    key: str
    fencing_token: int
    attempts: int


@dataclass(frozen=True)
class IdempotencyRecord:
    """One stored record, as operators see it (the result stays sealed; see ``result()``)."""

    tenant: str
    thread_id: str
    key: str
    kind: str
    name: str
    state: str
    fingerprint: str | None
    owner: str | None
    fencing_token: int
    attempts: int
    lease_expires_at: float | None
    created_at: float
    updated_at: float
    has_result: bool
    error: str | None


@dataclass(frozen=True)
class ClaimRow:
    """A record as a claim decision reads it (with the database's clock, ``now``)."""

    state: str
    fingerprint: str | None
    fencing_token: int
    attempts: int
    lease_expires_at: float | None
    now: float
    result: bytes | None
    holder_host: Any = None
    holder_pid: Any = None
    holder_start: Any = None
    holder_nonce: Any = None
    holder_lock: Any = None
    fp_mac: str | None = None


@dataclass(frozen=True)
class Wait:
    """No claim and no result yet: wait and try again (``reason`` says why)."""

    reason: str


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
