"""The tenant gate: which tenant a call acts for, and the record of every refused attempt.

:class:`TenantGate` holds the one scope rule of the package (README "Who a method acts for"):
the checkpointer methods resolve their tenant with :meth:`TenantGate.ref` /
:meth:`TenantGate.tenant`, the operator methods with :meth:`TenantGate.admin_tenant`, and a
cross-tenant attempt becomes an ``access_denied`` event plus :class:`AccessDenied`.

It knows the registry (to record events) and the saver's ``default_tenant``; it knows nothing
of keys, sealing, redaction or storage. A saver that learns the caller another way (the
LangGraph Server saver) subclasses it and sets ``SecureSaver.gate_class``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config

from .errors import AccessDenied, ConfigurationError, TenantRequired
from .offthread import to_thread
from .registry.core import Registry
from .registry.denials import log_for
from .run_tenants import RunTenants, run_of
from .tenancy import (
    ThreadRef,
    current_subject_scope,
    current_tenant_scope,
    thread_id_tenant,
    validate_namespace,
    validate_subject,
    validate_tenant,
    validate_thread_id,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Denial:
    """A refused cross-tenant attempt: ``actor`` tried ``operation`` on ``target``'s data."""

    actor: str
    target: str
    operation: str
    thread_id: str | None


class DeniedError(Exception):
    """Raised inside the resolution; :meth:`TenantGate.scoped` turns it into AccessDenied
    after recording the event (so the record is written outside any lock the caller holds)."""

    def __init__(self, denial: Denial) -> None:
        super().__init__(denial)
        self.denial = denial


#: the configurable key naming the subject (the end user) a thread belongs to
SUBJECT_KEY = "subject_id"


def thread_id_of(value: Any, what: str = "a thread id") -> str:
    """Ids are non-empty, bounded strings without NUL (ints and UUIDs are stringified)."""
    return validate_thread_id(value, what)


def _valid_thread_id(value: Any) -> str | None:
    """The thread id of a config, or None when it has none or one no column could hold."""
    if value in (None, ""):
        return None
    try:
        return thread_id_of(value)
    except ConfigurationError:
        return None


def run_configurable() -> Mapping[str, Any]:
    """The ``configurable`` of the LangGraph run the caller is in (what a node's store and
    ``get_config()`` see), or ``{}`` outside one."""
    config = var_child_runnable_config.get()
    conf = (config or {}).get("configurable") if isinstance(config, Mapping) else None
    return conf if isinstance(conf, Mapping) else {}


class TenantGate:
    """Resolves the tenant of every call of one saver (``owner``: its ``default_tenant`` and
    ``registry`` are read on each call, so a subclass may read more of it)."""

    DENIAL_ATTEMPTS = 3
    #: seconds a repeated refused attempt (counted into a summary) is held before its
    #: AccessDenied is raised: a caller looping on refused calls gets at most 100 a second
    #: per task instead of a share of the process
    REPEAT_HOLD = 0.01

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        #: the tenant of each LangGraph run this saver serves (see :mod:`.run_tenants`)
        self.runs = RunTenants()

    @property
    def registry(self) -> Registry:
        registry: Registry = self.owner.registry
        return registry

    @property
    def default_tenant(self) -> str | None:
        tenant: str | None = self.owner.default_tenant
        return tenant

    # the checkpointer methods -------------------------------------------------------------
    def tenant(self, operation: str, explicit: Any = None, thread_id: str | None = None,
               run: object | None = None) -> str:
        """The tenant a call acts for: the active scope, else ``explicit``, else the tenant
        of the LangGraph run ``run`` on ``thread_id`` (fixed by the run's explicit calls),
        else the default. An explicit tenant that differs from the run's is refused."""
        scoped = current_tenant_scope()
        if explicit is not None:
            explicit = validate_tenant(explicit)
            if scoped is not None and explicit != scoped:
                raise DeniedError(Denial(scoped, explicit, operation, thread_id))
        tenant = scoped or explicit
        if run is not None and thread_id is not None:
            if tenant is not None:
                other = self.runs.bind(run, thread_id, tenant)
                if other is not None:
                    raise DeniedError(Denial(tenant, other, operation, thread_id))
            else:
                tenant = self.runs.tenant_of(run, thread_id)
                if tenant is None and self.runs.is_ambiguous(run, thread_id):
                    raise TenantRequired(operation)  # never the default tenant either
        tenant = tenant or self.default_tenant
        if tenant is None:
            raise TenantRequired(operation)
        return tenant

    def caller(self, conf: Mapping[str, Any], operation: str,
               thread_id: str | None = None) -> str:
        """THE rule for who a call acts for, shared by the saver, the store and the server:
        the active :func:`tenant_scope`, else the config's ``tenant_id`` (or the tenant a
        returned thread id carries), else the tenant its LangGraph run acts for, else the
        default. A config naming another tenant than the scope is refused (recorded by
        :meth:`scoped`). ``conf``: the call's ``configurable`` (for calls that take no config
        -- the store's, ``delete_thread`` ... -- the run config LangGraph gives the node)."""
        explicit = conf.get("tenant_id")
        if explicit is None:
            explicit = thread_id_tenant(conf.get("thread_id"))
        if thread_id is None:
            thread_id = _valid_thread_id(conf.get("thread_id"))
        return self.tenant(operation, explicit, thread_id, run_of(conf))

    def ref(self, config: RunnableConfig, operation: str) -> ThreadRef:
        """The (tenant, thread, namespace) a config addresses."""
        conf = config.get("configurable") or {}
        if conf.get("thread_id") in (None, ""):
            raise ConfigurationError(f"{operation} needs config['configurable']['thread_id']")
        thread_id = _valid_thread_id(conf["thread_id"])
        # the tenant check comes first: a cross-tenant attempt with a malformed id is still a
        # cross-tenant attempt, and is recorded (without the id, which no column could hold)
        tenant = self.caller(conf, operation, thread_id)
        if thread_id is None:
            thread_id = thread_id_of(conf["thread_id"])  # raises the ConfigurationError
        subject = self.subject(conf, tenant, operation, thread_id)
        return ThreadRef(tenant, thread_id, validate_namespace(conf.get("checkpoint_ns", "")),
                         subject)

    def subject(self, conf: Any, tenant: str, operation: str,
                thread_id: str | None) -> str | None:
        """The subject a call names: the active :func:`subject_scope`, else
        ``configurable["subject_id"]``; None when neither does. A config naming another
        subject than the scope is a denied attempt (recorded without either subject)."""
        scoped = current_subject_scope()
        explicit = conf.get(SUBJECT_KEY) if hasattr(conf, "get") else None
        if explicit is not None:
            explicit = validate_subject(explicit, f"configurable[{SUBJECT_KEY!r}]")
            if scoped is not None and explicit != scoped:
                raise DeniedError(Denial(tenant, tenant, operation + " as another subject",
                                         thread_id))
        return scoped or explicit

    def scoped(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a resolution); a denial in it is recorded and raised as AccessDenied
        (a repeated one after :attr:`REPEAT_HOLD` seconds)."""
        try:
            return fn()
        except DeniedError as denied:
            error = self.record_denial(denied.denial)
        if error.repeated:
            time.sleep(self.REPEAT_HOLD)
        raise error

    async def ascoped(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except DeniedError as denied:
            error = await to_thread(self.record_denial, denied.denial)
        if error.repeated:
            await asyncio.sleep(self.REPEAT_HOLD)  # held on the loop: no thread is taken
        raise error

    def resolve_tenant(self, operation: str, thread_id: str | None = None) -> str:
        """:meth:`caller` for a call that takes no config (the run config of the LangGraph
        node it runs in, if any), with a denial recorded and raised."""
        conf = run_configurable()
        return self.scoped(lambda: self.caller(conf, operation, thread_id))

    async def aresolve_tenant(self, operation: str, thread_id: str | None = None) -> str:
        conf = run_configurable()
        return await self.ascoped(lambda: self.caller(conf, operation, thread_id))

    def resolve_ref(self, config: RunnableConfig, operation: str) -> ThreadRef:
        """:meth:`ref` with a denial recorded and raised."""
        return self.scoped(lambda: self.ref(config, operation))

    async def aresolve_ref(self, config: RunnableConfig, operation: str) -> ThreadRef:
        return await self.ascoped(lambda: self.ref(config, operation))

    # the operator methods -------------------------------------------------------------------
    def acting_scope(self) -> str | None:
        """Who the caller is for the scope rule of admin methods (the active tenant_scope;
        subclasses that know the caller otherwise, e.g. the LangGraph Server saver, say so)."""
        return current_tenant_scope()

    def admin_tenant(self, operation: str, tenant: Any = None, *,
                     operator_only: bool = False) -> str | None:
        """The one scope rule of every method that names a tenant (README: "Who a method acts
        for"). Unscoped calls are the operator's: they act for ``tenant`` (None: every
        tenant). Inside ``tenant_scope(t)`` they act for ``t`` only: ``tenant=None`` means
        ``t``, naming another tenant -- or calling an operator-only method, which acts for
        every tenant -- raises :class:`AccessDenied` and records the attempt."""
        scoped = self.acting_scope()
        named = None if tenant is None else validate_tenant(tenant)
        if scoped is None:
            return named
        if operator_only or (named is not None and named != scoped):
            raise self.record_denial(Denial(scoped, named or "*", operation, None))
        return scoped

    def reencrypt_tenants(self, tenants: Any) -> builtins.list[str] | None:
        """The tenants a re-encryption may touch under the scope rule (None: every one)."""
        if isinstance(tenants, (str, bytes)):
            raise ConfigurationError("reencrypt(tenants=...) takes a list of tenant ids")
        if self.acting_scope() is not None:
            named = [self.admin_tenant("reencrypt", t) for t in (tenants or [None])]
            return sorted({t for t in named if t is not None})
        return None if tenants is None else [validate_tenant(t) for t in tenants]

    # the record -----------------------------------------------------------------------------
    def record_denial(self, denial: Denial) -> AccessDenied:
        """Record an access-denied event and return the error to raise. The call is refused
        either way. The first attempt of an (actor, target, operation) is written at once
        (retried; if it cannot be, the error says so and it is kept for the next summary);
        further attempts within the window are counted into one summary event (see
        :mod:`.registry.denials`), so a flood cannot take the target's chain head on every
        attempt."""
        thread_id = denial.thread_id
        if thread_id is not None:
            try:   # an id no column could hold is left out, never the event
                thread_id = validate_thread_id(thread_id)
            except ConfigurationError:
                thread_id = None
        message = (f"tenant {denial.actor!r} may not {denial.operation} data of tenant "
                   f"{denial.target!r}") if denial.actor != denial.target else (
            f"refused in tenant {denial.target!r}: {denial.operation}")
        log = log_for(self.registry)
        if not log.attempt(denial.actor, denial.target, denial.operation, thread_id):
            if log.failing:
                return AccessDenied(message + "; the attempt could NOT be recorded yet (the "
                                    "registry is failing): it is counted and retried")
            repeated = AccessDenied(message + "; the attempt was recorded (counted into the "
                                    "access_denied summary of this window)")
            repeated.repeated = True
            return repeated
        logger.warning("access denied: tenant %r tried %s on tenant %r (thread %r)",
                       denial.actor, denial.operation, denial.target, denial.thread_id)
        failure: Exception | None = None
        for attempt in range(self.DENIAL_ATTEMPTS):
            try:
                log.write_first(denial.actor, denial.target, denial.operation, thread_id)
                failure = None
                break
            except Exception as exc:  # noqa: BLE001 - retried; the caller is refused anyway
                failure = exc
                time.sleep(0.05 * (attempt + 1))
        if failure is None:
            return AccessDenied(message + "; the attempt was recorded")
        log.defer(denial.actor, denial.target, denial.operation, thread_id)
        logger.error("could not record an access-denied event (%s); the call is refused",
                     type(failure).__name__)
        error = AccessDenied(message + f"; the attempt could NOT be recorded "
                             f"({type(failure).__name__}): check the registry database")
        error.__cause__ = failure
        return error
