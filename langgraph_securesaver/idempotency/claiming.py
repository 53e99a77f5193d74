"""How a key is claimed (a base class of :class:`~.store.IdempotencyStore`).

A first call inserts the record (one unique insert: the claim); a later one reads the record
and decides: replay a completed result, refuse a key reused with other arguments or one whose
outcome is unknown, take over a failed attempt or an expired or dead holder's claim (one
compare-and-set on the fencing token), or wait while another worker holds it. Before any
decision the record's fingerprint MAC is checked (tamper evidence, :mod:`..registry.integrity`),
and a live lease's holder is asked whether it is still there (:mod:`.liveness`, the PostgreSQL
session lock). The transitions of a claim once held, and the transactions and sealing this
relies on, are the store's. Log records keep the name ``langgraph_securesaver.idempotency.store``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import TamperedDataError
from ..keys.crypto import KeyManager
from ..offthread import to_thread
from ..registry.dialects import changed_row, insert_if_absent
from . import schema
from . import statements as stmts
from .errors import (
    IdempotencyAttemptsExhausted,
    IdempotencyConflict,
    IdempotencyKeyReused,
    IdempotencyOutcomeUnknown,
)
from .keys import KeyScope
from .liveness import (
    Holder,
    Liveness,
    PgSessionLock,
    current_holder,
    local_liveness,
    register_running,
    unregister_running,
)
from .policy import IdempotencyPolicy
from .records import Claim, ClaimRow, Hit, Wait
from .schema import COMPLETED, FAILED, IN_PROGRESS, UNKNOWN, idempotency_records

logger = logging.getLogger("langgraph_securesaver.idempotency.store")

_T = idempotency_records
_MAX_POLL = 0.5


class KeyClaims:
    """``acquire`` / ``aacquire``: claim a key or return its stored result."""

    dialect: str
    keys: KeyManager
    owner: str
    policy: IdempotencyPolicy
    _now: Any
    _host_id: str | None
    _session: PgSessionLock | None

    if TYPE_CHECKING:  # provided by IdempotencyStore (declared for the type checker only)
        def _begin(self, what: str) -> AbstractContextManager[Connection]: ...

        def _stmt(self, name: str, build: Callable[[], Any]) -> Any: ...

        def _open_value(self, scope: KeyScope, token: bytes) -> Any: ...

    # holder identity ------------------------------------------------------------------------
    def holder(self) -> Holder:
        """The identity this store writes on its claims (see ``liveness.py``)."""
        me = current_holder()
        if self._host_id is not None:
            return Holder(self._host_id, me.pid, me.start, me.nonce)
        return me

    def _holder_params(self) -> dict[str, Any]:
        me = self.holder()
        lock = self._session.key() if self._session is not None else None
        return {"v_holder_host": me.host_id, "v_holder_pid": me.pid,
                "v_holder_start": me.start, "v_holder_nonce": me.nonce, "v_holder_lock": lock}

    def _liveness(self, scope: KeyScope, row: ClaimRow) -> Liveness:
        """Is the holder of the in-progress claim ``row`` alive, dead, or unknown?"""
        ident = (scope.tenant, scope.thread_id, scope.key, row.fencing_token)
        verdict = local_liveness(self.holder(), ident, row.holder_host, row.holder_pid,
                                 row.holder_start, row.holder_nonce)
        if verdict != "unknown":
            return verdict
        lock = row.holder_lock
        if (self._session is not None and isinstance(lock, int)
                and not isinstance(lock, bool) and 0 < lock < (1 << 63)):
            with self._begin("checking the holder's session") as conn:
                if self._session.holder_gone(conn, lock):
                    return "dead"
            return "alive"
        return "unknown"

    def _select_row(self, scope: KeyScope) -> ClaimRow | None:
        q = self._stmt("select", lambda: sa.select(
            _T.c.state, _T.c.fingerprint, _T.c.fencing_token, _T.c.attempts,
            _T.c.lease_expires_at, self._now.label("now"), _T.c.result,
            *(_T.c[name] for name in schema.HOLDER_COLUMNS), _T.c.fp_mac).where(stmts.pk()))
        with self._begin("reading a key") as conn:
            r = conn.execute(q, stmts.pk_params(scope)).first()
        if r is None:
            return None
        return ClaimRow(r.state, r.fingerprint, int(r.fencing_token), int(r.attempts),
                    r.lease_expires_at, float(r.now),
                    bytes(r.result) if r.result is not None else None,
                    r.holder_host, r.holder_pid, r.holder_start, r.holder_nonce, r.holder_lock,
                    r.fp_mac)

    # tamper evidence (registry/integrity.py): the fingerprint is MACed with the registry key ------
    def _fp_mac(self, scope: KeyScope, fp: str | None) -> str:
        from ..registry.integrity import IDEMPOTENCY, idempotency_parts, integrity_of
        integ = self.__dict__.get("_integrity")
        if integ is None:
            integ = self.__dict__["_integrity"] = integrity_of(self.keys.store,
                                                               self.keys.provider)
        return str(integ.mac(IDEMPOTENCY, *idempotency_parts(scope.tenant, scope.thread_id,
                                                             scope.key, fp)))

    def _check_row(self, scope: KeyScope, row: ClaimRow) -> None:
        """Refuse a record whose fingerprint was altered (or that was inserted), and a stored
        result on a record not completed (a completed record never leaves that state)."""
        import hmac
        if row.fp_mac is None or not hmac.compare_digest(
                row.fp_mac, self._fp_mac(scope, row.fingerprint)):
            raise TamperedDataError(
                f"securesaver_idempotency record {scope.key} ({scope.name}): its argument "
                "fingerprint does not verify (altered, or the record was inserted); refusing "
                "to replay or execute")
        if row.result is not None and row.state != COMPLETED:
            raise TamperedDataError(
                f"securesaver_idempotency record {scope.key} ({scope.name}) holds a result "
                f"but is in state {row.state!r}: its state was altered; refusing to execute")

    def _try_insert(self, scope: KeyScope, fp: str | None, policy: IdempotencyPolicy
                    ) -> Claim | None:
        stmt = self._stmt("insert", lambda: stmts.build_insert(self.dialect, self._now))
        params = {"v_tenant": scope.tenant, "v_thread_id": scope.thread_id,
                  "v_key": scope.key, "v_kind": scope.kind, "v_name": scope.name[:255],
                  "v_fingerprint": fp, "v_owner": self.owner, "p_lease": policy.lease,
                  "v_fp_mac": self._fp_mac(scope, fp), "v_origin": scope.origin or None,
                  **self._holder_params()}
        claim = Claim(scope, 1, 1, self.owner, policy.lease, registered=True)
        register_running(_ident(claim))
        try:
            with self._begin("claiming a key") as conn:
                inserted = insert_if_absent(conn, stmt, params)
        except BaseException:
            end_claim(claim)
            raise
        if not inserted:
            end_claim(claim)
            return None
        return claim

    def _try_takeover(self, scope: KeyScope, fp: str | None, policy: IdempotencyPolicy,
                      seen_token: int, dead: bool = False) -> Claim | None:
        retry, check = policy.on_expired == "retry", fp is not None
        stmt = self._stmt(f"takeover-{retry}-{check}-{dead}",
                          lambda: stmts.build_takeover(self._now, retry, check, dead))
        params = {**stmts.pk_params(scope), "p_max_attempts": policy.max_attempts,
                  "p_owner": self.owner, "p_lease": policy.lease, "p_token": seen_token,
                  **self._holder_params()}
        if check:
            params["p_fp"] = fp
        pending = Claim(scope, seen_token + 1, 0, self.owner, policy.lease, registered=True)
        register_running(_ident(pending))
        try:
            with self._begin("taking over a key") as conn:
                r = changed_row(conn, stmt, params, (_T.c.fencing_token, _T.c.attempts),
                                (stmts.pk(),))
        except BaseException:
            end_claim(pending)
            raise
        if r is None:
            end_claim(pending)
            return None
        logger.info("idempotency key %s (%s) taken over%s: fencing token %s, attempt %s",
                    scope.key, scope.name, " from a dead holder" if dead else "",
                    r.fencing_token, r.attempts)
        pending.attempts = int(r.attempts)
        return pending

    def _expire_to_unknown(self, scope: KeyScope, token: int, dead: bool = False) -> None:
        now = self._now
        stmt = self._stmt(f"expire-unknown-{dead}", lambda: _T.update().where(
            stmts.pk(), _T.c.state == IN_PROGRESS, _T.c.fencing_token == sa.bindparam("p_token"),
            *(() if dead else (_T.c.lease_expires_at < now,))).values(
                state=UNKNOWN, updated_at=now, lease_expires_at=None))
        with self._begin("marking a key unknown") as conn:
            conn.execute(stmt, {**stmts.pk_params(scope), "p_token": token})

    # claiming -------------------------------------------------------------------------------
    def _acquire_step(self, scope: KeyScope, fp: str | None, policy: IdempotencyPolicy
                      ) -> Claim | Hit | Wait:
        row = self._select_row(scope)
        if row is None:
            claim = self._try_insert(scope, fp, policy)
            if claim is not None:
                return claim
            row = self._select_row(scope)
            if row is None:  # deleted in between (delete_thread); try again
                return Wait("the record vanished while claiming")
        self._check_row(scope, row)
        if row.fingerprint is not None and fp is not None and row.fingerprint != fp:
            raise IdempotencyKeyReused(
                f"idempotency key {scope.key} ({scope.name}) was first used with different "
                "arguments; refusing to replay or execute. Use a distinct key per operation.")
        if row.state == COMPLETED:
            if row.result is None:
                raise TamperedDataError(f"completed idempotency key {scope.key} has no result")
            return Hit(scope, self._open_value(scope, row.result), row.fencing_token,
                       row.attempts)
        if row.state == UNKNOWN:
            raise IdempotencyOutcomeUnknown(
                f"idempotency key {scope.key} ({scope.name}) is in state 'unknown': an attempt "
                "may have taken effect. Check the downstream system with this key, then call "
                "IdempotencyStore.resolve(...).")
        expired = (row.state == IN_PROGRESS and row.lease_expires_at is not None
                   and row.lease_expires_at < row.now)
        # a live lease: is its holder still there? (a dead one's claim is taken over at once)
        dead = (row.state == IN_PROGRESS and not expired
                and self._liveness(scope, row) == "dead")
        claimable = row.state == FAILED or ((expired or dead) and policy.on_expired == "retry")
        if claimable and row.attempts >= policy.max_attempts:
            raise IdempotencyAttemptsExhausted(
                f"idempotency key {scope.key} ({scope.name}) failed {row.attempts} time(s) "
                f"(max_attempts={policy.max_attempts}); it is not executed again")
        if claimable:
            claim = self._try_takeover(scope, fp, policy, row.fencing_token, dead=dead)
            if claim is not None:
                return claim
            return Wait("lost a takeover race")
        if (expired or dead) and policy.on_expired == "unknown":
            self._expire_to_unknown(scope, row.fencing_token, dead=dead)
            raise IdempotencyOutcomeUnknown(
                f"idempotency key {scope.key} ({scope.name}) was in progress when its holder "
                f"{'died' if dead else 'let its lease expire'}; recorded as 'unknown' "
                "(on_expired='unknown')")
        return Wait("in progress elsewhere")

    def _conflict(self, scope: KeyScope, waited: float | None) -> IdempotencyConflict:
        if waited is None:
            return IdempotencyConflict(
                f"idempotency key {scope.key} ({scope.name}) is in progress in another worker")
        return IdempotencyConflict(
            f"idempotency key {scope.key} ({scope.name}) stayed in progress in another worker "
            f"for {waited:.1f}s (wait_timeout)")

    def acquire(self, scope: KeyScope, *, fingerprint: str | None = None,
                policy: IdempotencyPolicy | None = None) -> Claim | Hit:
        """Claim ``scope`` or return its stored result; waits or raises on conflict per policy."""
        policy = policy or self.policy
        start = time.monotonic()
        delay = policy.poll_interval
        while True:
            step = self._acquire_step(scope, fingerprint, policy)
            if not isinstance(step, Wait):
                return step
            if policy.on_conflict == "raise" and step.reason == "in progress elsewhere":
                raise self._conflict(scope, None)
            waited = time.monotonic() - start
            if waited >= policy.wait_timeout:
                raise self._conflict(scope, waited)
            time.sleep(min(delay, max(0.0, policy.wait_timeout - waited)))
            delay = min(delay * 1.5, _MAX_POLL)

    async def aacquire(self, scope: KeyScope, *, fingerprint: str | None = None,
                       policy: IdempotencyPolicy | None = None) -> Claim | Hit:
        policy = policy or self.policy
        start = time.monotonic()
        delay = policy.poll_interval
        while True:
            step = await to_thread(self._acquire_step, scope, fingerprint, policy)
            if not isinstance(step, Wait):
                return step
            if policy.on_conflict == "raise" and step.reason == "in progress elsewhere":
                raise self._conflict(scope, None)
            waited = time.monotonic() - start
            if waited >= policy.wait_timeout:
                raise self._conflict(scope, waited)
            await asyncio.sleep(min(delay, max(0.0, policy.wait_timeout - waited)))
            delay = min(delay * 1.5, _MAX_POLL)


def _ident(claim: Claim) -> tuple[str, str, str, int]:
    return (claim.scope.tenant, claim.scope.thread_id, claim.scope.key, claim.token)


def end_claim(claim: Claim) -> None:
    """This process no longer works on ``claim`` (once per claim)."""
    if claim.registered:
        claim.registered = False
        unregister_running(_ident(claim))
