"""Who a call acts for, and where that tenant's threads live in the inner saver.

The tenant comes from ``config["configurable"]["tenant_id"]``, else from :func:`tenant_scope`
(set it in request middleware from the authenticated identity), else from the saver's
``default_tenant``. When a scope is active it is the caller's identity: a config naming a
different tenant is refused with :class:`AccessDenied` and recorded.

Storage is namespaced: tenant ``acme``'s thread ``t1`` is stored under
``<tag(acme)>:t1`` where the tag is a fixed-length digest of the tenant id, so two tenants
can use the same thread id without colliding, and a thread id cannot forge another tag.

Ids are printed to operators, so none may hold a control character (C0/C1, DEL,
bidirectional controls, line separators) or an invisible one (Default_Ignorable_Code_Point
outside the script and emoji sequences that show it): :mod:`.textsafety`. Letters of every
script, punctuation, spaces inside and emoji are fine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .errors import ConfigurationError
from .textsafety import validate_id_text

_scope: ContextVar[str | None] = ContextVar("securesaver_tenant_scope", default=None)
_subject: ContextVar[str | None] = ContextVar("securesaver_subject_scope", default=None)
MAX_TENANT_LENGTH = 255
MAX_SUBJECT_LENGTH = 255
# every registry/vault/idempotency column that holds a thread id is VARCHAR(512); the bound is
# checked up front so every backend refuses the same ids (SQLite would accept longer ones)
MAX_THREAD_ID_LENGTH = 512
MAX_NAMESPACE_LENGTH = 2048


def validate_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_LENGTH:
        raise ConfigurationError(
            f"tenant ids are non-empty strings of at most {MAX_TENANT_LENGTH} characters, "
            f"got {_short(tenant)}"
        )
    if "\x00" in tenant or tenant != tenant.strip():
        raise ConfigurationError(f"tenant id {_short(tenant)} has NUL or surrounding whitespace")
    return validate_id_text(tenant, "a tenant id")


def validate_subject(subject: object, what: str = "a subject id") -> str:
    """A subject id (the end user a thread belongs to): bounded like a tenant id. The value
    is personal data, so an error names its type and length, never the value."""
    if not isinstance(subject, str) or not subject or len(subject) > MAX_SUBJECT_LENGTH:
        size = f"{len(subject)} characters" if isinstance(subject, str) else (
            type(subject).__name__)
        raise ConfigurationError(
            f"{what} must be a non-empty string of at most {MAX_SUBJECT_LENGTH} characters, "
            f"got {size}")
    if "\x00" in subject or subject != subject.strip():
        raise ConfigurationError(f"{what} has NUL or surrounding whitespace")
    return validate_id_text(subject, what)


def validate_thread_id(value: object, what: str = "a thread id") -> str:
    """Thread ids are non-empty strings (ints and UUIDs are accepted and stringified) of at
    most ``MAX_THREAD_ID_LENGTH`` characters, without NUL."""
    import uuid
    text = str.__str__(value) if isinstance(value, str) else (
        str(value) if isinstance(value, (int, uuid.UUID)) else "")
    if isinstance(value, bool) or not text or "\x00" in text:
        raise ConfigurationError(f"{what} must be a non-empty string without NUL, "
                                 f"got {_short(value)}")
    if len(text) > MAX_THREAD_ID_LENGTH:
        raise ConfigurationError(
            f"{what} is {len(text)} characters long; thread ids are at most "
            f"{MAX_THREAD_ID_LENGTH} characters")
    return validate_id_text(text, what)


def validate_namespace(value: object) -> str:
    """A checkpoint namespace: a string (``""`` for the root graph) without NUL, bounded."""
    text = "" if value is None else value
    if not isinstance(text, str):
        raise ConfigurationError(f"checkpoint_ns must be a string, got {_short(value)}")
    if "\x00" in text or len(text) > MAX_NAMESPACE_LENGTH:
        raise ConfigurationError(
            f"checkpoint_ns must be at most {MAX_NAMESPACE_LENGTH} characters without NUL "
            f"(got {len(text)} characters)")
    return validate_id_text(text, "checkpoint_ns")


def validate_actor(value: object, what: str = "requested_by") -> str | None:
    """Who asked for an operation (recorded in events and receipts): bounded like a tenant."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TENANT_LENGTH \
            or "\x00" in value:
        raise ConfigurationError(
            f"{what} must be a non-empty string of at most {MAX_TENANT_LENGTH} characters "
            f"without NUL, got {_short(value)}")
    return validate_id_text(value, what)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


@contextmanager
def tenant_scope(tenant: str) -> Iterator[str]:
    """Run the enclosed calls as ``tenant`` (works across threads started with copy_context
    and across ``await``)."""
    token = _scope.set(validate_tenant(tenant))
    try:
        yield tenant
    finally:
        _scope.reset(token)


def current_tenant_scope() -> str | None:
    """The tenant of the innermost active :func:`tenant_scope`, or ``None`` outside one."""
    return _scope.get()


@contextmanager
def subject_scope(subject: str) -> Iterator[str]:
    """Write the enclosed calls' threads as ``subject``'s (the end user they belong to; set
    it in request middleware from the authenticated user). A config naming another subject
    (``configurable["subject_id"]``) is refused with AccessDenied."""
    token = _subject.set(validate_subject(subject))
    try:
        yield subject
    finally:
        _subject.reset(token)


def current_subject_scope() -> str | None:
    """The subject of the innermost active :func:`subject_scope`, or ``None`` outside one."""
    return _subject.get()


class TenantThreadId(str):
    """A thread id, equal to the plain string, that carries the tenant it was returned for.

    SecureSaver returns thread ids of this type in the configs of calls whose config named
    the tenant: LangGraph builds some configs from a returned config's thread id alone (the
    subgraph reads of ``get_state(..., subgraphs=True)``, a task's ``state`` config), and the
    tenant travels with the id there. It is worth exactly a ``tenant_id`` in the config:
    a scope naming another tenant still refuses the call, and ``str(id)`` keeps the tenant.
    """

    tenant: str

    def __new__(cls, value: str, tenant: str) -> TenantThreadId:
        self = super().__new__(cls, value)
        self.tenant = tenant
        return self

    def __str__(self) -> str:
        return self  # LangGraph normalizes ids with str(); the tenant stays with the id

    def __reduce__(self) -> tuple[Any, ...]:
        return (TenantThreadId, (str.__str__(self), self.tenant))

    def __copy__(self) -> TenantThreadId:
        return self

    def __deepcopy__(self, memo: Any) -> TenantThreadId:
        return self


def thread_id_tenant(value: object) -> str | None:
    """The tenant a returned thread id carries (see :class:`TenantThreadId`), if any."""
    tenant = getattr(value, "tenant", None) if isinstance(value, TenantThreadId) else None
    return tenant if isinstance(tenant, str) else None


def tagged_thread_id(value: object, tenant: str) -> object:
    """``value`` as a thread id carrying ``tenant`` (non-string ids are left alone)."""
    if isinstance(value, TenantThreadId) and value.tenant == tenant:
        return value
    return TenantThreadId(str.__str__(value), tenant) if isinstance(value, str) else value


@lru_cache(maxsize=65536)
@lru_cache(maxsize=4096)
def tenant_tag(tenant: str) -> str:
    return "t" + hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:24]


def thread_prefix(tenant: str) -> str:
    return tenant_tag(tenant) + ":"


def inner_thread_id(tenant: str, thread_id: str) -> str:
    return thread_prefix(tenant) + thread_id


def looks_tagged(thread_id: str) -> bool:
    """Whether a thread id has the form of a tenant-tagged inner id (``tenant_tag`` + ":"):
    one SecureSaver wrote, not a raw saver."""
    head, sep, _ = thread_id.partition(":")
    return bool(sep) and len(head) == 25 and head[0] == "t" and all(
        c in "0123456789abcdef" for c in head[1:])


def outer_thread_id(tenant: str, inner_id: str) -> str | None:
    """The caller's thread id for an inner id, or None if it belongs to another tenant."""
    prefix = thread_prefix(tenant)
    return inner_id[len(prefix):] if inner_id.startswith(prefix) else None


@dataclass(frozen=True)
class ThreadRef:
    """One thread of one tenant, with the id the inner saver knows it by."""

    tenant: str
    thread_id: str
    checkpoint_ns: str = ""
    #: the subject the call names (scope or config), if any: not part of the thread's identity
    subject: str | None = field(default=None, compare=False)

    @property
    def inner_id(self) -> str:
        return inner_thread_id(self.tenant, self.thread_id)
