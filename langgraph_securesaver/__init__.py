"""langgraph-securesaver: an encrypted, tenant-isolated checkpoint saver for LangGraph.

The top level holds what a newcomer needs: the saver, the store, keys, retention, tenancy and
the errors. Capabilities live in named subpackages: ``idempotency`` (exactly-once tools and
recovery), ``redaction``, ``store``, ``server``, ``evidence``."""

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
    from .keys.keyring import Keyring
    from .keys.provider import KeyProvider
    from .retention import RetentionPolicy
    from .saver import SecureSaver
    from .store import SecureStore
    from .tenancy import current_subject_scope, current_tenant_scope, subject_scope, tenant_scope

__version__ = "0.1.0"

# Every public name is loaded on first use (PEP 562): importing a submodule -- the CLI, the
# audit -- does not pay for LangGraph, LangChain and SQLAlchemy unless it uses them.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("AccessDenied", "AsyncOnlySaverError", "ConfigurationError",
                     "DeltaChannelPruneError", "KeyGoneError", "KeyringMismatch",
                     "KeyringRequired", "SecureSaverError", "StoreNotReachedError",
                     "TamperedDataError",
                     "TenantRequired", "UnsealedDataError", "UnsupportedBySaverError",
                     "UnsupportedFilterError"),
                    "errors"),
    "Keyring": "keys.keyring",
    "KeyProvider": "keys.provider",
    "RetentionPolicy": "retention",
    "SecureSaver": "saver",
    "SecureStore": "store",
    **dict.fromkeys(("current_subject_scope", "current_tenant_scope", "subject_scope",
                     "tenant_scope"), "tenancy"),
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
    "AccessDenied",
    "AsyncOnlySaverError",
    "ConfigurationError",
    "DeltaChannelPruneError",
    "KeyGoneError",
    "KeyProvider",
    "Keyring",
    "KeyringMismatch",
    "KeyringRequired",
    "RetentionPolicy",
    "SecureSaver",
    "SecureSaverError",
    "SecureStore",
    "StoreNotReachedError",
    "TamperedDataError",
    "TenantRequired",
    "UnsealedDataError",
    "UnsupportedBySaverError",
    "UnsupportedFilterError",
    "__version__",
    "current_subject_scope",
    "current_tenant_scope",
    "subject_scope",
    "tenant_scope",
]
