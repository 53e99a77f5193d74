"""SecureSaver behind LangGraph Server (``langgraph dev`` / ``langgraph up`` / the platform).

In ``langgraph.json``::

    "checkpointer": {"backend": "custom", "path": "./checkpointer.py:checkpointer"}

with ``checkpointer.py``::

    from langgraph_securesaver.server.saver import make_checkpointer

    checkpointer = make_checkpointer()            # tenant = the authenticated user's identity
    # or: make_checkpointer(tenant_of=lambda user: user["org_id"])   # one tenant per org

(``"path": "langgraph_securesaver.server.checkpointer"`` — dots, no colon — uses the defaults
without a file.) The server calls ``checkpointer()``, enters the async context manager it
returns once per event-loop thread, and uses the :class:`AuthTenantSaver` it yields.

Configuration comes from the environment (``.env`` / ``"env"`` in langgraph.json):

==================================  ==========================================================
``SECURESAVER_URL``                 ``sqlite:///path.db`` or ``postgresql://...`` (required)
``SECURESAVER_MASTER_KEY``          the keyring (``securesaver keygen`` prints it), or
``SECURESAVER_KEYRING_FILE``        a keyring file (``securesaver keygen --out ...``), or
``SECURESAVER_KEY_PROVIDER``        a key provider URL, e.g. ``aws-kms://alias/securesaver``
``SECURESAVER_REDACTION``           ``on`` (default) or ``off``
``SECURESAVER_RETENTION_IDLE_TTL``  default retention, e.g. ``30d`` (unset: keep)
``SECURESAVER_RETENTION_MAX_AGE``   e.g. ``1y``
``SECURESAVER_RETENTION_STRATEGY``  ``delete`` (default) or ``keep_latest``
``SECURESAVER_TENANT_FIELD``        the user field that names the tenant (default ``identity``)
``SECURESAVER_DEFAULT_TENANT``      tenant for calls with no user (unset: they are refused)
``SECURESAVER_SUBJECT_FIELD``       the user field that names the subject (default
                                    ``identity``; ``none``: no subject): threads are recorded
                                    for it, as a keyed digest, so ``forget_subject`` finds
                                    them; another user writing the thread is refused
==================================  ==========================================================

Who a call acts for. LangGraph custom auth (``"auth": {"path": ...}``) authenticates every
request; the server keeps the user in its request context and, for runs, also in
``config["configurable"]["langgraph_auth_user"]`` (reserved: clients cannot set it). For every
checkpointer call :class:`AuthTenantSaver` takes the user from the request context, else from
the config, and maps it to a tenant with ``tenant_of`` (default: the user's ``identity``, or
the field named by ``SECURESAVER_TENANT_FIELD``). Then:

* if the two sources (or an explicit :func:`tenant_scope`) name different tenants, the call is
  refused with :class:`AccessDenied` and recorded;
* a ``tenant_id`` in ``configurable`` — which clients *can* send with a run — must equal the
  user's tenant, otherwise :class:`AccessDenied`, recorded (it is never a way in);
* the server's worker rolls runs back (``multitask_strategy="rollback"``, cancel with
  ``action="rollback"``) by calling ``adelete_for_runs([run_id])`` with no user: that call
  acts for the tenant this process saw writing the run (remembered from its authenticated
  ``put`` calls, the latest 65,536 runs), and only there. Who *asked* for the cancel never
  reaches the checkpointer (the cancel request only flags the run; the worker deletes), so it
  cannot refuse a cancel by another user: that isolation is the server's owner filter
  (``@auth.on``, as in examples/langgraph_server/auth.py);
* any other call with no user (TTL sweeps, a run this process did not see, Studio's own user,
  an unauthenticated request) acts for ``SECURESAVER_DEFAULT_TENANT`` if you set one, and
  otherwise raises :class:`TenantRequired`: it touches no tenant's data. Run retention with
  SecureSaver's own pruner (``securesaver prune --url ... --every 10m``), not the server's
  ``checkpointer.ttl``.

What the server stores itself, outside the checkpointer -- thread, run, assistant and cron
records and the long-term store -- is covered by :mod:`.encryption` (the
``encryption`` entry) and :mod:`.store` (the ``store`` entry); the record file of
``langgraph dev``'s in-memory runtime, which also holds copies the handlers never see, is
sealed by :mod:`.records` (called from the auth module): docs/guides/langgraph-server.md.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from ..errors import TenantRequired
from ..gate import Denial, DeniedError, TenantGate
from ..saver import SecureSaver
from ..tenancy import (
    ThreadRef,
    current_tenant_scope,
    tenant_scope,
    validate_subject,
    validate_tenant,
)
from .records import warn_if_unsealed
from .settings import ServerSettings

logger = logging.getLogger(__name__)

TenantOf = Callable[[Any], "str | None"]

_AUTH_KEYS = ("langgraph_auth_user", "langgraph_auth_user_id")


def user_field(user: Any, field: str) -> Any:
    """``user[field]`` for mapping-like users (the server's ProxyUser, dicts), else the
    attribute; ``None`` when the user has no such field."""
    if user is None:
        return None
    try:
        return user[field]
    except (KeyError, TypeError, IndexError, AttributeError):
        pass
    try:
        return getattr(user, field, None)
    except (NotImplementedError, AttributeError, KeyError):  # a raising property: no tenant
        return None


def _is_studio_user(user: Any) -> bool:
    return type(user).__name__ == "StudioUser" or user_field(user, "kind") == "StudioUser"


def tenant_from_field(field: str = "identity") -> TenantOf:
    """The default ``tenant_of``: the user's ``field`` (a non-empty string) is the tenant.

    Unauthenticated users (identity ``""``) and Studio's built-in user name no tenant. Write
    your own ``tenant_of(user) -> str | None`` to map users differently (e.g. to an org id
    your auth handler put in the user dict); returning ``None`` refuses the call.
    """
    def tenant_of(user: Any) -> str | None:
        if user is None or _is_studio_user(user):
            return None
        if user_field(user, "is_authenticated") is False:
            return None
        value = user_field(user, field)
        if not isinstance(value, str) or not value:
            return None
        return value
    tenant_of.__name__ = f"tenant_from_field({field!r})"
    return tenant_of


def subject_from_field(field: str = "identity") -> TenantOf:
    """The default ``subject_of``: the user's ``field`` (default ``identity``) is the subject
    their threads are recorded for (``forget_subject``), as a keyed digest. Unauthenticated
    and Studio users name none; write your own ``subject_of(user) -> str | None`` otherwise."""
    read = tenant_from_field(field)

    def subject_of(user: Any) -> str | None:
        return read(user)
    subject_of.__name__ = f"subject_from_field({field!r})"
    return subject_of


def server_auth_user() -> Any:
    """The user of the current server request or run (None outside LangGraph Server).

    Read from the server's own request context (``langgraph_api.utils.get_auth_ctx``) only
    when the server has loaded it: this never imports the server into another process.
    """
    utils = sys.modules.get("langgraph_api.utils")
    get_auth_ctx = getattr(utils, "get_auth_ctx", None)
    if get_auth_ctx is None:
        return None
    ctx = get_auth_ctx()
    return None if ctx is None else getattr(ctx, "user", None)


class AuthTenantGate(TenantGate):
    """The tenant of a call is the LangGraph Server's authenticated user (``owner.tenant_of``
    maps it); the scope, the auth context and the config's user must agree."""

    def _user_tenant(self, user: Any) -> str | None:
        if user is None:
            return None
        tenant = self.owner.tenant_of(user)
        return None if tenant is None else validate_tenant(tenant)

    def sources(self, configurable: Mapping[str, Any] | None) -> list[str]:
        """The tenants named by the scope, the server's auth context and the config's user."""
        sources: list[str] = []
        scoped = current_tenant_scope()
        if scoped is not None:
            sources.append(scoped)
        from_ctx = self._user_tenant(server_auth_user())
        if from_ctx is not None:
            sources.append(from_ctx)
        if configurable is not None and any(k in configurable for k in _AUTH_KEYS):
            user = configurable.get("langgraph_auth_user")
            if user is None and configurable.get("langgraph_auth_user_id"):
                user = {"identity": configurable["langgraph_auth_user_id"]}
            from_config = self._user_tenant(user)
            if from_config is not None:
                sources.append(from_config)
        return sources

    def subject(self, conf: Any, tenant: str, operation: str,
                thread_id: str | None) -> str | None:
        """The subject of a call: the authenticated user's (``owner.subject_of``), which a
        ``subject_scope`` or a client-sent ``configurable["subject_id"]`` must equal (else
        AccessDenied, recorded); without a user, the scope's or the config's."""
        named = super().subject(conf, tenant, operation, thread_id)
        found = [s for s in (*self._user_subjects(conf), named) if s is not None]
        for other in found[1:]:
            if other != found[0]:
                raise DeniedError(Denial(tenant, tenant, operation + " as another subject",
                                         thread_id))
        return found[0] if found else None

    def _user_subjects(self, configurable: Mapping[str, Any] | None) -> list[str]:
        subject_of = getattr(self.owner, "subject_of", None)
        if subject_of is None:
            return []
        users = [server_auth_user()]
        if configurable is not None and any(k in configurable for k in _AUTH_KEYS):
            user = configurable.get("langgraph_auth_user")
            if user is None and configurable.get("langgraph_auth_user_id"):
                user = {"identity": configurable["langgraph_auth_user_id"]}
            users.append(user)
        found = []
        for user in users:
            subject = None if user is None else subject_of(user)
            if subject is not None:
                found.append(validate_subject(subject, "subject_of(user)"))
        return found

    def acting_scope(self) -> str | None:
        """Admin methods (pii_inventory, events, ...) act for the authenticated user's tenant
        (unscoped, i.e. the operator's, only when there is no user)."""
        sources = self.sources(None)
        return sources[0] if sources else None

    def _caller_tenant(self, configurable: Mapping[str, Any] | None, operation: str,
                       thread_id: str | None) -> str:
        """The tenant this call acts for; raises when it has none or its sources disagree."""
        sources = self.sources(configurable)
        for other in sources[1:]:
            if other != sources[0]:
                raise DeniedError(Denial(sources[0], other, operation, thread_id))
        if sources:
            return sources[0]
        if self.default_tenant is not None:
            return self.default_tenant
        raise TenantRequired(operation + " (no authenticated LangGraph Server user)")

    def caller(self, conf: Mapping[str, Any], operation: str,
               thread_id: str | None = None) -> str:
        """The base rule, with the authenticated user as the scope: the scope, the auth
        context and the config's user must agree (else AccessDenied, recorded)."""
        thread = conf.get("thread_id") if thread_id is None else thread_id
        tenant = self._caller_tenant(conf, operation, None if thread is None else str(thread))
        with _scope_as(tenant):
            return super().caller(conf, operation, thread_id)

    def ref(self, config: RunnableConfig, operation: str) -> ThreadRef:
        conf = config.get("configurable") or {}
        ref = super().ref(config, operation)
        run_id = conf.get("run_id")
        if isinstance(run_id, str) and run_id and operation in ("put", "put_writes"):
            _RUNS.remember(run_id, ref.tenant)
        return ref

    def tenant(self, operation: str, explicit: Any = None, thread_id: str | None = None,
               run: object | None = None) -> str:
        tenant = self._caller_tenant(None, operation, thread_id)
        with _scope_as(tenant):
            return super().tenant(operation, explicit, thread_id, run)


class AuthTenantSaver(SecureSaver):
    """A :class:`SecureSaver` whose tenant is the LangGraph Server's authenticated user.
    Every argument but the two below is SecureSaver's.

    Args:
        tenant_of: maps the server's user object to a tenant id (``None`` = no tenant).
        subject_of: maps it to the subject its threads are recorded for (``forget_subject``;
            default: the user's ``identity``; ``None`` from the mapping = no subject).
    """

    gate_class = AuthTenantGate

    def __init__(self, *args: Any, tenant_of: TenantOf | None = None,
                 subject_of: TenantOf | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tenant_of: TenantOf = tenant_of or tenant_from_field()
        self.subject_of: TenantOf = subject_of or subject_from_field()

    # The server rolls a run back (multitask_strategy="rollback", cancel action="rollback")
    # from its worker *without* a user: adelete_for_runs([run_id]) then acts for the tenant
    # this process saw writing that run (learned from authenticated calls), nothing else.
    def _run_groups(self, run_ids: Sequence[str]) -> dict[str, list[str]] | None:
        gate = self.services.gate
        if isinstance(gate, AuthTenantGate) and gate.sources(None):
            return None          # a caller with an identity: the ordinary path
        groups: dict[str, list[str]] = {}
        for run_id in run_ids:
            tenant = _RUNS.tenant_of(str(run_id))
            if tenant is None:
                return None      # unknown or ambiguous run: default tenant or TenantRequired
            groups.setdefault(tenant, []).append(str(run_id))
        return groups

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        groups = self._run_groups(list(run_ids))
        if not groups:
            return super().delete_for_runs(run_ids)
        for tenant, ids in groups.items():
            with tenant_scope(tenant):
                super().delete_for_runs(ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        groups = self._run_groups(list(run_ids))
        if not groups:
            return await super().adelete_for_runs(run_ids)
        for tenant, ids in groups.items():
            with tenant_scope(tenant):
                await super().adelete_for_runs(ids)


class _RunTenants:
    """run id -> the tenant that wrote it, for the most recent runs of this process (a run id
    seen under two tenants is forgotten: such a run is never cleaned up without a user)."""

    def __init__(self, size: int = 65536) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._map: OrderedDict[str, str | None] = OrderedDict()

    def remember(self, run_id: str, tenant: str) -> None:
        with self._lock:
            if run_id in self._map:
                if self._map[run_id] != tenant:
                    self._map[run_id] = None
                self._map.move_to_end(run_id)
                return
            self._map[run_id] = tenant
            while len(self._map) > self.size:
                self._map.popitem(last=False)

    def tenant_of(self, run_id: str) -> str | None:
        with self._lock:
            return self._map.get(run_id)


_RUNS = _RunTenants()


@contextmanager
def _scope_as(tenant: str) -> Iterator[None]:
    """``tenant_scope(tenant)`` unless that tenant already is the scope."""
    if current_tenant_scope() == tenant:
        yield
        return
    with tenant_scope(tenant):
        yield


def make_checkpointer(*, tenant_of: TenantOf | None = None,
                      subject_of: TenantOf | None = None,
                      settings: ServerSettings | None = None,
                      **saver_options: Any) -> Callable[[], Any]:
    """A ``checkpointer`` for langgraph.json: a callable returning an async context manager
    that opens an :class:`AuthTenantSaver` on ``SECURESAVER_URL`` (set up, ready) and closes
    it when the server stops.

    Args:
        tenant_of: user -> tenant id (default: :func:`tenant_from_field` with
            ``SECURESAVER_TENANT_FIELD``, i.e. the user's ``identity``).
        subject_of: user -> subject id (default: :func:`subject_from_field` with
            ``SECURESAVER_SUBJECT_FIELD``, i.e. the user's ``identity``).
        settings: use these instead of reading the environment when the server starts.
        saver_options: passed to SecureSaver (e.g. ``redaction=Redactor(...)``).
    """
    @asynccontextmanager
    async def checkpointer() -> AsyncIterator[AuthTenantSaver]:
        warn_if_unsealed()
        cfg = settings or ServerSettings.from_env()
        options: dict[str, Any] = {"retention": cfg.retention,
                                   "default_tenant": cfg.default_tenant}
        if not cfg.redaction:
            options["redaction"] = None
        options.update(saver_options)
        resolve = tenant_of or tenant_from_field(cfg.tenant_field)
        subject = subject_of or (subject_from_field(cfg.subject_field)
                                 if cfg.subject_field is not None else _no_subject)
        async with AuthTenantSaver.afrom_url(cfg.url, keyring=cfg.keyring,
                                             **options) as opened:
            saver = cast(AuthTenantSaver, opened)
            saver.tenant_of = resolve   # before the server makes its first call
            saver.subject_of = subject
            logger.info("SecureSaver for LangGraph Server on %s (tenant from %s)",
                        _redact_url(cfg.url), getattr(resolve, "__name__", "tenant_of"))
            yield saver
    return checkpointer


def _no_subject(user: Any) -> str | None:
    """``subject_of`` when threads are recorded for no subject."""
    return None


def _redact_url(url: str) -> str:
    head, sep, tail = url.partition("://")
    if "@" in tail:
        tail = "***@" + tail.rsplit("@", 1)[1]
    return head + sep + tail


checkpointer = make_checkpointer()
"""The defaults: ``"path": "langgraph_securesaver.server.checkpointer"`` in langgraph.json."""
