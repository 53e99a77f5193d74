"""What the at-rest scan reports: the kinds of violation it knows, one violation, the report.

Kept apart from :mod:`.scan` (which reads the rows) so the CLI can print a report and explain
its kinds without the scanner's imports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

VIOLATIONS: dict[str, str] = {
    "plaintext_channel_value": "a channel value is stored without encryption",
    "inline_channel_value": "a channel value is inlined in the clear checkpoint JSONB",
    "plaintext_write": "a pending write is stored without encryption",
    "missing_sealed_metadata": "a checkpoint has no sealed metadata",
    "plaintext_metadata": "the sealed-metadata field holds no ciphertext",
    "clear_metadata_key": "a metadata key outside the allowlist is stored in clear",
    "malformed_blind_index": "a blind-index entry is not a keyed digest",
    "pii_in_clear_column": "personal data or a secret in a clear column",
    "unknown_tenant": "a row's thread id carries no known tenant's tag",
    "unknown_data_key": "a ciphertext names a data-key version its tenant does not have",
    "unknown_master_key": "a key row is wrapped by a master version the keyring lacks",
    "key_does_not_unwrap": "a tenant's data keys do not unwrap with this keyring",
    "token_fails_authentication": "a ciphertext does not authenticate for its place",
    "plaintext_binary": "a binary column of a securesaver_* table holds no ciphertext",
    "undecodable_row": "a row cannot be decoded",
    "checkpoint_fails_verification": "a checkpoint is refused by reads (manifest, parent, "
                                     "channels, clear metadata, blind index or pending writes)",
    "unevaluated_payload": "a row holds a serialized object SecureSaver never writes (msgpack "
                           "extension / constructor); it was not evaluated",
    "write_moved": "a pending write sits at another idx or task path than it was sealed for",
    "plaintext_store_value": "a store item holds no SecureStore ciphertext (plain, forged or "
                             "extra fields)",
    "summary_drift": "an audit summary differs from a recount of the raw rows (the audit "
                     "answers from it until it is refreshed: `securesaver summaries`)",
    "unregistered_thread": "a stored thread has no registry row (no retention applies; the "
                           "audit that reads summaries does not list it)",
}


@dataclass(frozen=True)
class Violation:
    """One finding: the kind, the table, where in it, and a detail that never holds a value."""

    kind: str
    table: str
    location: str
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "table": self.table, "location": self.location,
                "detail": self.detail}


@dataclass
class ScanReport:
    backend: str
    started_at: float
    duration: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    verified: int = 0
    violations: list[Violation] = field(default_factory=list)
    # tenant -> data-key version -> ciphertexts naming it (what a key rotation still needs)
    key_versions: dict[str, dict[int, int]] = field(default_factory=dict)
    master_versions: dict[str, int] = field(default_factory=dict)
    keyring_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "backend": self.backend, "started_at": self.started_at,
            "duration_s": round(self.duration, 3), "rows": self.rows, "tokens": self.tokens,
            "verified": self.verified, "keyring_checked": self.keyring_checked,
            "master_versions_in_use": self.master_versions,
            "data_key_versions": {t: {str(k): n for k, n in sorted(v.items())}
                                  for t, v in sorted(self.key_versions.items())},
            "violations_by_kind": self.by_kind(),
            "violations": [v.as_dict() for v in self.violations],
        }
