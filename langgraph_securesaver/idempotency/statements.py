"""The statements of the idempotency store, built from SQLAlchemy Core once per store and
kept parameterized (building an expression per call costs more than the round trip).

Every state change is one of these: the unique insert of a new claim, a takeover ``UPDATE``
of a failed, expired or dead claim, and the compare-and-set ``UPDATE`` of each transition
(``WHERE`` the key, the expected state and this worker's fencing token). Statements only:
what to do with their results is :mod:`.store`'s.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..registry.dialects import absent_insert
from . import schema
from .keys import KeyScope
from .schema import COMPLETED, FAILED, IN_PROGRESS, UNKNOWN, idempotency_records

_T = idempotency_records


def pk() -> sa.ColumnElement[bool]:
    """WHERE the row is the key bound as ``p_tenant``, ``p_thread``, ``p_key``."""
    return sa.and_(_T.c.tenant == sa.bindparam("p_tenant"),
                   _T.c.thread_id == sa.bindparam("p_thread"),
                   _T.c.key == sa.bindparam("p_key"))


def pk_params(scope: KeyScope) -> dict[str, Any]:
    return {"p_tenant": scope.tenant, "p_thread": scope.thread_id, "p_key": scope.key}


def lease_param(now: Any) -> sa.ColumnElement[float]:
    """The database clock plus the lease bound as ``p_lease`` (seconds)."""
    return now + sa.bindparam("p_lease", type_=sa.Float)


def holder_values() -> dict[str, Any]:
    return {name: sa.bindparam(f"v_{name}") for name in schema.HOLDER_COLUMNS}


def build_insert(dialect: str, now: Any) -> Any:
    values: dict[str, Any] = {c: sa.bindparam(f"v_{c}") for c in (
        "tenant", "thread_id", "key", "kind", "name", "fingerprint", "owner", "fp_mac",
        "origin")}
    values.update(state=IN_PROGRESS, fencing_token=1, attempts=1,
                  lease_expires_at=lease_param(now), created_at=now, updated_at=now,
                  **holder_values())
    # run by insert_if_absent: drivers disagree on the rowcount of ON CONFLICT inserts
    return absent_insert(dialect, _T, values)


def build_takeover(now: Any, retry_expired: bool, check_fp: bool, dead: bool = False) -> Any:
    """Claim a failed key, an expired claim (``retry_expired``), or (``dead``) exactly the
    in-progress claim with fencing token ``p_token`` whose holder was found dead. Run by
    ``changed_row`` for the new fencing token and attempts."""
    claimable: sa.ColumnElement[bool] = _T.c.state == FAILED
    if dead:
        claimable = _T.c.state == IN_PROGRESS
    elif retry_expired:
        claimable = sa.or_(claimable, sa.and_(_T.c.state == IN_PROGRESS,
                                              _T.c.lease_expires_at < now))
    # the token this worker saw is pinned, so it knows the token it gets (token + 1) and
    # registers it as running before the row changes hands
    conds = [pk(), claimable, _T.c.attempts < sa.bindparam("p_max_attempts"),
             _T.c.fencing_token == sa.bindparam("p_token")]
    if check_fp:
        conds.append(sa.or_(_T.c.fingerprint.is_(None),
                            _T.c.fingerprint == sa.bindparam("p_fp")))
    return (_T.update().where(*conds).values(
        state=IN_PROGRESS, owner=sa.bindparam("p_owner"),
        fencing_token=_T.c.fencing_token + 1, attempts=_T.c.attempts + 1,
        lease_expires_at=lease_param(now), updated_at=now, **holder_values()))


def build_cas(dialect: str, now: Any, kind: str) -> Any:
    """UPDATE ... WHERE <key> AND state = in_progress AND fencing_token = <ours>."""
    values: dict[str, Any] = {"updated_at": now}
    if kind == "renew":
        values["lease_expires_at"] = lease_param(now)
    elif kind == "complete":
        values.update(state=COMPLETED, result=sa.bindparam("v_blob"), error=None,
                      lease_expires_at=None)
    elif kind in ("fail", "unknown"):
        values.update(state=FAILED if kind == "fail" else UNKNOWN,
                      error=sa.bindparam("v_blob"), lease_expires_at=None)
    elif kind == "release":
        greatest = sa.func.max if dialect == "sqlite" else sa.func.greatest
        values.update(state=FAILED, error=None, lease_expires_at=None,
                      attempts=greatest(_T.c.attempts - 1, 0))
    else:  # pragma: no cover - internal misuse
        raise ValueError(kind)
    return _T.update().where(pk(), _T.c.state == IN_PROGRESS,
                             _T.c.fencing_token == sa.bindparam("p_token")).values(**values)
