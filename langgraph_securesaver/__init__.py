"""langgraph-securesaver: an encrypted, tenant-isolated checkpoint saver for LangGraph."""

from typing import TYPE_CHECKING, Any

from .crypto import TenantKeys
from .errors import (
    AccessDenied,
    AsyncOnlySaverError,
    ConfigurationError,
    DeltaChannelPruneError,
    KeyringRequired,
    SecureSaverError,
    TamperedDataError,
    TenantRequired,
    UnsupportedFilterError,
)
from .keyring import KeyProvider, Keyring, WrappedKey
from .registry import Registry
from .retention import PruneReport, RetentionPolicy
from .saver import DEFAULT_METADATA_ALLOWLIST, SecureSaver
from .tenancy import current_tenant_scope, tenant_scope

if TYPE_CHECKING:
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

__version__ = "0.1.0"

# the idempotency API, importable from here too; loaded on first use (it pulls in
# langgraph.prebuilt, which doubles the import time of the package)
_IDEMPOTENCY_EXPORTS = frozenset({
    "IdempotencyConflict", "IdempotencyKeyReused", "IdempotencyPolicy", "IdempotentToolCalls",
    "arecover_stalled", "current_idempotency_key", "idempotent", "is_replaying",
    "mark_recoverable", "recover_stalled", "run_once",
})


def __getattr__(name: str) -> Any:
    if name in _IDEMPOTENCY_EXPORTS:
        from . import idempotency
        value = getattr(idempotency, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
    "KeyProvider",
    "Keyring",
    "KeyringRequired",
    "PruneReport",
    "Registry",
    "RetentionPolicy",
    "SecureSaver",
    "SecureSaverError",
    "TamperedDataError",
    "TenantKeys",
    "TenantRequired",
    "UnsupportedFilterError",
    "WrappedKey",
    "__version__",
    "arecover_stalled",
    "current_idempotency_key",
    "current_tenant_scope",
    "idempotent",
    "is_replaying",
    "mark_recoverable",
    "recover_stalled",
    "run_once",
    "tenant_scope",
]
