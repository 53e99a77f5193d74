"""The key-provider protocol, wrapped keys, and the provider with no keys: what the registry
and the audit name without holding a master key (nothing here imports ``cryptography``).
:mod:`.keyring` holds the master keys and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import KeyringRequired


@dataclass(frozen=True)
class WrappedKey:
    """A data key sealed by the provider: which master version sealed it, and the bytes."""

    master_version: str
    blob: bytes = field(repr=False)


@runtime_checkable
class KeyProvider(Protocol):
    """What SecureSaver needs from wherever master keys live (file, env, KMS, Vault).

    ``context`` is associated data the provider must bind into the wrap (tenant, key purpose and
    version), so a wrapped key copied to another tenant fails to unwrap. ``unwrap`` raises
    :class:`TamperedDataError` for every failure, including an unknown master version. The
    raw key ``unwrap`` returns is held by SecureSaver as
    :class:`~langgraph_securesaver.keys.material.SecretBytes` at once; an adapter should not
    keep it in a local of a frame that can raise (see docs/concepts/keys.md).

    Optional: ``reload() -> bool`` re-reads the provider's source; SecureSaver calls it (at
    most every ``KeyManager.reload_interval`` seconds) when a key row names a master version
    the provider does not hold, so processes follow a rotation done elsewhere. Optional too:
    ``record_database(id, label)`` / ``other_databases(id)`` (see :class:`Keyring`).
    """

    @property
    def current_version(self) -> str: ...

    def versions(self) -> list[str]: ...

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey: ...

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes: ...


class NoKeys:
    """A provider with no keys, for read-only jobs that never decrypt (audit, scan listings).

    It cannot unwrap the registry MAC key either, so such a job cannot verify or write
    registry rows: the retention pruner refuses to run with it.

    Any attempt to wrap or unwrap fails closed with :class:`KeyringRequired`.
    """

    current_version = "none"

    def versions(self) -> list[str]:
        return []

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey:
        del key                           # not in the frame of the error
        raise KeyringRequired("this job runs without keys and cannot create tenant keys")

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        raise KeyringRequired("this job runs without keys and cannot decrypt")
