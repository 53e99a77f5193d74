"""Where registry tables keep tenant-key ciphertexts: the columns scans authenticate and
re-encryption rewrites (:mod:`..audit.scan`, :mod:`..ops.rotation`).

A module of its own, without SQLAlchemy or the serializer, so that a companion store's schema
(:mod:`..idempotency.schema`) registers its columns without importing :mod:`.raw_tables`: the
read-only commands (``securesaver events``, ``audit``) import the schemas, never the scan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SealedColumn:
    """A registry column holding tenant-key ciphertexts whose associated data is known, so
    scans can authenticate it and re-encryption can rewrite it."""

    table: str
    column: str
    tenant_column: str
    aad: Callable[[Mapping[str, Any]], bytes]


SEALED_COLUMNS: dict[tuple[str, str], SealedColumn] = {}


def register_sealed_column(spec: SealedColumn) -> None:
    """Companion stores call this for each sealed column they add (re-encrypted and verified
    like the built-in ones)."""
    SEALED_COLUMNS[(spec.table, spec.column)] = spec


def _pii_vault_aad(row: Mapping[str, Any]) -> bytes:
    from ..registry.pii_vault import _aad
    return _aad(str(row["tenant"]), str(row["token"]))


register_sealed_column(SealedColumn("securesaver_pii_vault", "sealed", "tenant", _pii_vault_aad))
