"""The idempotency store: atomic claims, leases with fencing tokens, sealed results.

Every state change is ONE SQL statement (a unique insert, or a compare-and-set ``UPDATE``
whose ``WHERE`` names the expected state and fencing token), so two workers, threads or
processes can never both believe they own a key. Leases are compared with the database clock
(``CURRENT_TIMESTAMP``-style expressions evaluated by the server), never a worker's clock.

The store uses the registry's SQLAlchemy engine (same database as the checkpoints by default).
The engine's pool is thread-safe; async callers run each statement in a worker thread, so the
event loop is never blocked. Any database failure is raised as
:class:`IdempotencyStoreUnavailable` before the effect runs (fail closed).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import sqlalchemy as sa
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from sqlalchemy.engine import Connection, Engine

from ..errors import ConfigurationError, TamperedDataError
from ..keys.crypto import KeyManager, TenantKeys
from ..offthread import to_thread
from ..registry.core import engine_lock
from ..registry.dialects import MYSQL, SUPPORTED
from . import schema
from . import statements as stmts
from .admin import RecordAdmin
from .claiming import KeyClaims, end_claim
from .errors import IdempotencyError, IdempotencyLeaseLost, IdempotencyStoreUnavailable
from .heartbeat import _Heartbeat
from .keys import KeyScope, business_key, fingerprint
from .liveness import PgSessionLock
from .policy import DEFAULT_POLICY, IdempotencyPolicy
from .records import (
    Claim,
    Hit,
    Outcome,
    default_owner,
)
from .schema import db_now, idempotency_records

if TYPE_CHECKING:
    from ..services import SaverLike, SaverServices

logger = logging.getLogger(__name__)

T = TypeVar("T")
_T = idempotency_records
_for_saver_lock = threading.Lock()
_COMPLETE_RETRIES = (0.05, 0.2, 0.5)


RESULT_CHANNEL = "__idempotency__"  # the channel name results are redacted under (policies)


class IdempotencyStore(KeyClaims, RecordAdmin):
    """Claims, leases and sealed results of idempotent effects, per tenant and thread.

    Args:
        engine: SQLAlchemy engine (SQLite, PostgreSQL or MySQL), usually
            ``saver.registry.engine``.
        keys: the saver's :class:`KeyManager` (results are sealed with the tenant's data key and
            keys/fingerprints are HMACs under the tenant's index key).
        serde: serializer for results (LangGraph's JsonPlusSerializer by default).
        policy: default :class:`IdempotencyPolicy` of calls that give none.
        saver: the SecureSaver this store belongs to (tenant resolution, fences).
        owner: worker identity written on claims for operators (default ``host:pid``).
        host_id: override the host id written on claims and compared on conflicts (default:
            derived from the kernel boot id and the pid namespace, see ``liveness.py``). Two
            workers with the same host id check each other's pids: never give the same value
            to processes that cannot see each other's pids. Meant for tests.
        session_lock: on PostgreSQL, tie claims to a session advisory lock held by a dedicated
            connection of this store, so a crashed worker's claims are taken over as soon as
            its connection drops (default True). Turn off behind a transaction-mode pooler
            (pgbouncer), where session locks do not follow the client.
    """

    def __init__(self, engine: Engine, keys: KeyManager, serde: SerializerProtocol | None = None,
                 *, policy: IdempotencyPolicy | None = None, saver: SaverLike | None = None,
                 owner: str | None = None, host_id: str | None = None,
                 session_lock: bool = True, services: SaverServices | None = None) -> None:
        self.dialect = engine.dialect.name
        # MySQL: READ COMMITTED, as the registry's (an engine the caller made included)
        self.engine = (engine.execution_options(isolation_level="READ COMMITTED")
                       if self.dialect in MYSQL else engine)
        if self.dialect not in SUPPORTED:
            raise ConfigurationError(f"the idempotency store runs on SQLite, PostgreSQL or "
                                     f"MySQL/MariaDB, not {self.dialect!r}")
        self.keys = keys
        self.serde = serde or JsonPlusSerializer()
        self.policy = policy or DEFAULT_POLICY
        self.saver = saver
        # the saver's narrow interface: its tenant gate and PII layer (None: a bare store)
        self.services = services if services is not None else (
            saver.services if saver is not None else None)
        self.owner = owner or default_owner()
        self._now = db_now(self.dialect)
        self._serial = engine_lock(engine)
        self._statements: dict[str, Any] = {}
        self._setup_lock = threading.Lock()
        self._is_setup = False
        self._heartbeat = _Heartbeat(self)
        self._fenced: dict[tuple[str, str, str, str], None] = {}
        self._host_id = host_id
        self._session: PgSessionLock | None = None
        if self.dialect == "postgresql" and session_lock:
            session = self._session = PgSessionLock(engine)
            sa.event.listen(engine, "engine_disposed", lambda _engine: session.close())

    @property
    def pg_session(self) -> PgSessionLock | None:
        """The PostgreSQL session lock tying this store's claims to a connection (or None)."""
        return self._session

    # construction -------------------------------------------------------------------------
    @classmethod
    def for_saver(cls, saver: SaverLike, **options: Any) -> IdempotencyStore:
        """The store of ``saver`` (created once per saver and serializer, then cached)."""
        companions = saver.services.companions
        key = ("idempotency", id(saver.serde))
        store: IdempotencyStore | None = companions.get(key)
        if store is not None and not options:
            return store
        with _for_saver_lock:
            store = companions.get(key)
            if store is None or options:
                store = cls(saver.registry.engine, saver.keys, saver.serde, saver=saver,
                            **options)
                companions[key] = store
        return store

    @classmethod
    def for_services(cls, services: SaverServices) -> IdempotencyStore:
        """A store of the saver behind ``services`` (the one already built, if any): what the
        purge path uses to delete a thread's records."""
        with _for_saver_lock:
            for key, store in services.companions.items():
                if key[0] == "idempotency":
                    return cast(IdempotencyStore, store)
            store = cls(services.registry.engine, services.keys, services=services)
            services.companions[("idempotency", None)] = store
            return store

    def setup(self) -> None:
        """Create the tables (idempotent; safe from several processes)."""
        with self._setup_lock:
            if self._is_setup:
                return
            setup_registry = getattr(self.keys.store, "setup", None)
            if callable(setup_registry):
                setup_registry()  # the shared tables first
            with self._serial, self._db("setup"):
                try:
                    schema.metadata.create_all(self.engine, checkfirst=True)
                except sa.exc.SQLAlchemyError:
                    # another process created them between the check and the CREATE
                    schema.metadata.create_all(self.engine, checkfirst=True)
            self._is_setup = True

    async def asetup(self) -> None:
        await to_thread(self.setup)

    @contextmanager
    def _db(self, what: str) -> Iterator[None]:
        try:
            yield
        except sa.exc.SQLAlchemyError as exc:
            raise IdempotencyStoreUnavailable(
                f"idempotency store unavailable during {what}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc

    @contextmanager
    def _begin(self, what: str) -> Iterator[Connection]:
        if not self._is_setup:
            self.setup()
        with self._serial, self._db(what), self.engine.begin() as conn:
            yield conn

    def tenant_keys(self, tenant: str) -> TenantKeys:
        """The tenant's keys (created on first use); store errors fail closed."""
        hit = self.keys.cached(tenant)
        if hit is not None:
            return hit
        with self._db("loading tenant keys"):
            keys = self.keys.keys_for(tenant, create=True)
        if keys is None:  # create=True always returns keys
            raise TamperedDataError(f"no keys for tenant {tenant!r}")
        return keys

    def db_time(self) -> float:
        """The database clock (epoch seconds)."""
        with self._begin("reading the clock") as conn:
            return float(conn.execute(sa.select(self._now)).scalar_one())

    # keyed derivatives: of tokenized values only -------------------------------------------
    def tokenized(self, keys: TenantKeys, thread_id: str, value: Any) -> Any:
        """``value`` with each PII value replaced by its vault entry's public token (the
        references recorded under ``thread_id``): what keys and fingerprints are derived from,
        so that none of them confirms a value once its entry is erased (redaction off: the
        value itself)."""
        if self.services is None:
            return value
        return self.services.pii.redact_for_store(keys, thread_id, value, RESULT_CHANNEL)

    def fingerprint_of(self, keys: TenantKeys, thread_id: str, args: Any) -> str:
        """The argument fingerprint of a call made in ``thread_id`` (tokenized arguments)."""
        return fingerprint(keys, self.tokenized(keys, thread_id, args))

    def business_scope(self, keys: TenantKeys, *, thread_id: str, origin: str, name: str,
                       value: Any) -> KeyScope:
        """The record of business key ``value`` (``thread_id`` "" for a tenant-wide key,
        claimed from thread ``origin``): derived from the tokenized value."""
        text = str(value)
        blind = str(self.tokenized(keys, thread_id or origin, text))
        if blind != text and (":masked>" in blind or "<" not in blind):
            # a masked or dropped value: the keys of different values would collide
            raise ConfigurationError(
                f"the redaction policy masks or drops part of the business key of {name!r}: "
                "keys of different values would be equal. Tokenize that kind "
                "(Action.TOKENIZE, the default) or build the key from other parts")
        return KeyScope(keys.tenant, thread_id, business_key(
            keys, thread_id=thread_id, name=name, value=blind), "business", name,
            "" if thread_id else origin)

    # serialization --------------------------------------------------------------------------
    def _seal_value(self, scope: KeyScope, value: Any) -> bytes:
        keys = self.tenant_keys(scope.tenant)
        if self.services is not None:  # results go through the saver's redactor (PII vault)
            value = self.services.pii.redact_for_store(keys, scope.refs_thread, value,
                                                       RESULT_CHANNEL)
        type_, data = self.serde.dumps_typed(value)
        return keys.seal(type_.encode("utf-8") + b"\x00" + data, scope.result_aad())

    def _open_value(self, scope: KeyScope, token: bytes) -> Any:
        keys = self.tenant_keys(scope.tenant)
        raw = keys.open(token, scope.result_aad())
        type_, sep, data = raw.partition(b"\x00")
        if not sep:
            raise TamperedDataError("idempotency result has no type header")
        value = self.serde.loads_typed((type_.decode("utf-8"), data))
        if self.services is not None:
            value = self.services.pii.restore_for_store(keys, value)
        return value

    def _seal_error(self, scope: KeyScope, error: BaseException | str) -> bytes:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        keys = self.tenant_keys(scope.tenant)
        if self.services is not None:
            text = self.services.pii.redact_for_store(keys, scope.refs_thread, text,
                                                      RESULT_CHANNEL)
        return keys.seal(text.encode("utf-8", "replace"), scope.error_aad())

    # statements (built once, parameterized: building SQLAlchemy expressions per call costs
    # more than the round trip) -------------------------------------------------------------------
    def _stmt(self, name: str, build: Callable[[], Any]) -> Any:
        stmt = self._statements.get(name)
        if stmt is None:
            stmt = self._statements[name] = build()
        return stmt

    # transitions of a claim -------------------------------------------------------------------
    def _cas(self, claim: Claim, kind: str, what: str, *, ends: bool = True,
             **params: Any) -> bool:
        stmt = self._stmt(f"cas-{kind}", lambda: stmts.build_cas(self.dialect, self._now, kind))
        try:
            with self._begin(what) as conn:
                n = conn.execute(stmt, {**stmts.pk_params(claim.scope), "p_token": claim.token,
                                        **params}).rowcount
        finally:
            if ends and kind != "renew":  # the claim ends here (or is lost)
                end_claim(claim)
        return bool(n == 1)

    def renew(self, claim: Claim) -> bool:
        """Extend the lease (heartbeat). False if the claim was lost."""
        ok = self._cas(claim, "renew", "renewing a lease", p_lease=claim.lease)
        if not ok:
            claim.lost = True
        return ok

    def complete(self, claim: Claim, value: Any) -> None:
        """Store the result and mark the key completed (only if this claim still owns it)."""
        try:
            sealed = self._seal_value(claim.scope, value)
        except (TypeError, ValueError) as exc:
            self.mark_unknown(claim, f"result could not be serialized: {exc}")
            raise IdempotencyError(
                f"the effect of {claim.scope.name} ran but its result ({type(value).__name__}) "
                "cannot be serialized, so it cannot be replayed; the key was marked 'unknown'. "
                "Return JSON-like values, messages or pydantic models.") from exc
        try:
            self._complete_sealed(claim, sealed)
        finally:
            end_claim(claim)

    def _complete_sealed(self, claim: Claim, sealed: bytes) -> None:
        last: IdempotencyStoreUnavailable | None = None
        for pause in (*_COMPLETE_RETRIES, None):
            try:
                ok = self._cas(claim, "complete", "completing a key", ends=False,
                               v_blob=sealed)
            except IdempotencyStoreUnavailable as exc:
                last = exc
                if pause is None:
                    break
                time.sleep(pause)
                continue
            if not ok:
                claim.lost = True
                raise IdempotencyLeaseLost(
                    f"idempotency key {claim.scope.key} ({claim.scope.name}) was taken over by "
                    f"another worker (this claim's fencing token {claim.token} is stale); this "
                    "attempt's result was not stored")
            return
        if last is None:  # pragma: no cover - the loop always sets it before breaking
            raise IdempotencyStoreUnavailable("completing a key failed")
        raise IdempotencyStoreUnavailable(
            f"the effect of {claim.scope.name} ran but its result could not be recorded; the "
            "key stays in progress until a retry takes it over (same key) or its lease "
            "expires") from last

    def fail(self, claim: Claim, error: BaseException | str) -> bool:
        """Record a failed attempt (retryable until ``max_attempts``)."""
        try:
            return self._cas(claim, "fail", "recording a failure",
                             v_blob=self._seal_error(claim.scope, error))
        except IdempotencyStoreUnavailable:
            logger.exception("could not record the failure of idempotency key %s",
                             claim.scope.key)
            return False
        finally:
            end_claim(claim)

    def release(self, claim: Claim) -> bool:
        """Give the claim back without counting the attempt (e.g. the call was interrupted)."""
        try:
            return self._cas(claim, "release", "releasing a key")
        except IdempotencyStoreUnavailable:
            logger.exception("could not release idempotency key %s", claim.scope.key)
            return False

    def mark_unknown(self, claim: Claim, reason: str) -> bool:
        try:
            return self._cas(claim, "unknown", "marking a key unknown",
                             v_blob=self._seal_error(claim.scope, reason))
        except IdempotencyStoreUnavailable:
            logger.exception("could not mark idempotency key %s unknown", claim.scope.key)
            return False
        finally:
            end_claim(claim)

    # one call -------------------------------------------------------------------------------
    def execute(self, scope: KeyScope, fn: Callable[[Claim], T], *,
                fingerprint: str | None = None, policy: IdempotencyPolicy | None = None,
                is_failure: Callable[[Any], bool] | None = None) -> Outcome:
        """Run ``fn(claim)`` at most once per key (per completed result); replay otherwise."""
        policy = policy or self.policy
        got = self.acquire(scope, fingerprint=fingerprint, policy=policy)
        if isinstance(got, Hit):
            return Outcome(got.value, True, scope.key, got.token, got.attempts)
        claim = got
        tracking = self._heartbeat.track(claim) if policy.heartbeat else _null()
        with tracking:
            try:
                value = fn(claim)
            except BaseException as exc:
                self._after_exception(claim, exc)
                raise
        if is_failure is not None and is_failure(value):
            self.fail(claim, _failure_text(value))
        else:
            self.complete(claim, value)
        return Outcome(value, False, scope.key, claim.token, claim.attempts)

    async def aexecute(self, scope: KeyScope, fn: Callable[[Claim], Awaitable[T]], *,
                       fingerprint: str | None = None, policy: IdempotencyPolicy | None = None,
                       is_failure: Callable[[Any], bool] | None = None) -> Outcome:
        policy = policy or self.policy
        got = await self.aacquire(scope, fingerprint=fingerprint, policy=policy)
        if isinstance(got, Hit):
            return Outcome(got.value, True, scope.key, got.token, got.attempts)
        claim = got
        tracking = self._heartbeat.track(claim) if policy.heartbeat else _null()
        with tracking:
            try:
                value = await fn(claim)
            except BaseException as exc:
                await to_thread(self._after_exception, claim, exc)
                raise
        if is_failure is not None and is_failure(value):
            await to_thread(self.fail, claim, _failure_text(value))
        else:
            await to_thread(self.complete, claim, value)
        return Outcome(value, False, scope.key, claim.token, claim.attempts)

    def _after_exception(self, claim: Claim, exc: BaseException) -> None:
        from langgraph.errors import GraphBubbleUp
        if isinstance(exc, (GraphBubbleUp, asyncio.CancelledError, KeyboardInterrupt)):
            self.release(claim)
        else:
            self.fail(claim, exc)

    # fences (used by the decorators) -------------------------------------------------------------
    def fenced(self, tenant: str, thread_id: str, ns: str, checkpoint_id: str) -> bool:
        return (tenant, thread_id, ns, checkpoint_id) in self._fenced

    def remember_fence(self, tenant: str, thread_id: str, ns: str, checkpoint_id: str) -> None:
        if len(self._fenced) > 10_000:
            self._fenced.clear()
        self._fenced[(tenant, thread_id, ns, checkpoint_id)] = None


def _failure_text(value: Any) -> str:
    content = getattr(value, "content", value)
    return f"error result: {str(content)[:2000]}"


@contextmanager
def _null() -> Iterator[None]:
    yield
