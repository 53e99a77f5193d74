"""Evidence an auditor can check without the database or the keyring: subject access
exports (:mod:`.export`), Ed25519 signatures beside any document the CLI writes
(:mod:`.signing`), and the receipt and event chains those documents carry (:mod:`.chains`).

May import: the checkpointer layer it sits in (:mod:`..store`, whose sealed items an export
opens) and every layer below (keys, registry, storage, the per-turn path, audit, idempotency,
operations); never the saver or the CLI. :class:`.api.EvidenceOperations` is a base class of
SecureSaver.
"""

from .signing import (
    SIGNATURE_FORMAT,
    PublicKey,
    SigningKey,
    Verdict,
    signature_path,
    signed_file,
    verify_file,
)

__all__ = ["SIGNATURE_FORMAT", "PublicKey", "SigningKey", "Verdict", "signature_path",
           "signed_file", "verify_file"]
