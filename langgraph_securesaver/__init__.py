"""langgraph-securesaver: an encrypted, tenant-isolated checkpoint saver for LangGraph."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import (
        AccessDenied,
        AsyncOnlySaverError,
        ConfigurationError,
        DeltaChannelPruneError,
        KeyGoneError,
        KeyringMismatch,
        KeyringRequired,
        SecureSaverError,
        StoreNotReachedError,
        TamperedDataError,
        TenantRequired,
        UnsealedDataError,
        UnsupportedBySaverError,
        UnsupportedFilterError,
    )
    from .idempotency import (
        IdempotencyConflict,
        IdempotencyKeyReused,
        IdempotencyPolicy,
        IdempotentToolCalls,
        arecover_stalled,
        current_idempotency_key,
        idempotent,
        is_replaying,
        mark_recoverable,
        recover_stalled,
        run_once,
    )
    from .keys.crypto import TenantKeys
    from .keys.keyring import KeyProvider, Keyring, WrappedKey
    from .ops.subjects import SubjectErasure
    from .registry.core import Registry
    from .retention import PruneReport, RetentionPolicy
    from .saver import DEFAULT_METADATA_ALLOWLIST, SecureSaver
    from .store import SecureStore
    from .tenancy import current_subject_scope, current_tenant_scope, subject_scope, tenant_scope

__version__ = "0.1.0"

# Every public name is loaded on first use (PEP 562): importing a submodule -- the CLI, the
# audit -- does not pay for LangGraph, LangChain and SQLAlchemy unless it uses them (the
# idempotency API alone pulls in langgraph.prebuilt, which doubles the import time).
_EXPORTS: dict[str, str] = {
    "TenantKeys": "keys.crypto",
    **dict.fromkeys(("AccessDenied", "AsyncOnlySaverError", "ConfigurationError",
                     "DeltaChannelPruneError", "KeyGoneError", "KeyringMismatch",
                     "KeyringRequired", "SecureSaverError", "StoreNotReachedError",
                     "TamperedDataError",
                     "TenantRequired", "UnsealedDataError", "UnsupportedBySaverError",
                     "UnsupportedFilterError"),
                    "errors"),
    **dict.fromkeys(("IdempotencyConflict", "IdempotencyKeyReused", "IdempotencyPolicy",
                     "IdempotentToolCalls", "arecover_stalled", "current_idempotency_key",
                     "idempotent", "is_replaying", "mark_recoverable", "recover_stalled",
                     "run_once"), "idempotency"),
    **dict.fromkeys(("KeyProvider", "Keyring", "WrappedKey"), "keys.keyring"),
    "Registry": "registry.core",
    **dict.fromkeys(("PruneReport", "RetentionPolicy"), "retention"),
    **dict.fromkeys(("DEFAULT_METADATA_ALLOWLIST", "SecureSaver"), "saver"),
    "SecureStore": "store",
    **dict.fromkeys(("current_subject_scope", "current_tenant_scope", "subject_scope",
                     "tenant_scope"), "tenancy"),
    "SubjectErasure": "ops.subjects",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "DEFAULT_METADATA_ALLOWLIST",
    "AccessDenied",
    "AsyncOnlySaverError",
    "ConfigurationError",
    "DeltaChannelPruneError",
    "IdempotencyConflict",
    "IdempotencyKeyReused",
    "IdempotencyPolicy",
    "IdempotentToolCalls",
    "KeyGoneError",
    "KeyProvider",
    "Keyring",
    "KeyringMismatch",
    "KeyringRequired",
    "PruneReport",
    "Registry",
    "RetentionPolicy",
    "SecureSaver",
    "SecureSaverError",
    "SecureStore",
    "StoreNotReachedError",
    "SubjectErasure",
    "TamperedDataError",
    "TenantKeys",
    "TenantRequired",
    "UnsealedDataError",
    "UnsupportedBySaverError",
    "UnsupportedFilterError",
    "WrappedKey",
    "__version__",
    "arecover_stalled",
    "current_idempotency_key",
    "current_subject_scope",
    "current_tenant_scope",
    "idempotent",
    "is_replaying",
    "mark_recoverable",
    "recover_stalled",
    "run_once",
    "subject_scope",
    "tenant_scope",
]
