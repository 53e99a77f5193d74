"""langgraph-securesaver: an encrypted, tenant-isolated checkpoint saver for LangGraph."""

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

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_METADATA_ALLOWLIST",
    "AccessDenied",
    "AsyncOnlySaverError",
    "ConfigurationError",
    "DeltaChannelPruneError",
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
    "current_tenant_scope",
    "tenant_scope",
]
