"""Ed25519 signatures beside the documents the CLI writes, checked offline with the public key.

The signing key is separate from every encryption key: it proves who wrote a document, never
opens one, and an auditor holds only its public half.

Format ``securesaver-signature/1`` (one rule for every kind of document, JSON or HTML): the
document ``FILE`` is written unchanged, and beside it ``FILE.sig`` holds one JSON object,
written canonically on one line::

    {"format": "securesaver-signature/1",
     "signed": {"kind": "subject-export", "sha256": "<hex digest of FILE's bytes>",
                "size": <FILE's length in bytes>, "signed_at": "<ISO 8601, UTC>",
                "key_id": "ed25519:<first 32 hex digits of SHA-256(raw public key)>"},
     "signature": "<base64 of the 64-byte Ed25519 signature>"}

The signature is over ``b"securesaver-signature/1\\n"`` followed by the canonical JSON of
``signed`` (keys sorted, no spaces, ASCII only). The document's digest, not the document, is
signed because Ed25519 needs its whole message in memory and an export may be gigabytes,
written while the database is read (docs/auditors.md shows the check with openssl alone).

The private key is a PKCS#8 PEM file, read and written like a keyring file (mode 0600, owned
by the user, never through a symlink) and held as :class:`SigningKey`, whose ``repr`` shows
its key id only; parsing failures are raised from a frame that holds none of the file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, NoReturn, TextIO, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..errors import ConfigurationError
from ..keys.keyring_file import check_permissions, insecure_allowed, write_keyring_text
from ..keys.material import Refusal, SecretText, refusing_outside

SIGNATURE_FORMAT = "securesaver-signature/1"
#: the suffix of the signature file beside a document
SIG_SUFFIX = ".sig"
_SIGNED_FIELDS = {"kind": str, "sha256": str, "size": int, "signed_at": str, "key_id": str}
_MAX_SIG_BYTES = 64 << 10
_MAX_PUBLIC_BYTES = 64 << 10
_MAX_KEY_BYTES = 64 << 10


def _key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


def signed_message(signed: dict[str, Any]) -> bytes:
    """The bytes the signature covers (see the module docstring)."""
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return (SIGNATURE_FORMAT + "\n" + canonical).encode("ascii")


class SigningKey:
    """An Ed25519 private key that does not print (``repr``: its key id)."""

    __slots__ = ("__key", "key_id")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigurationError("a signing key is an Ed25519 private key")
        self.__key = key
        self.key_id = _key_id(key.public_key())

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str], *,
             allow_insecure_permissions: bool | None = None) -> SigningKey:
        """The key in a PEM file (``securesaver signing-key``). Refused like a keyring file
        when group or others can read it (``SECURESAVER_ALLOW_INSECURE_KEYRING=1`` opts
        out, e.g. for a read-only secret mount)."""
        text = refusing_outside(_read_private, Path(path),
                                insecure_allowed(allow_insecure_permissions))
        return cls(refusing_outside(_parse_private, text, str(path)))

    def public_key(self) -> PublicKey:
        return PublicKey(self.__key.public_key())

    def sign(self, message: bytes) -> bytes:
        return self.__key.sign(message)

    def save(self, private_path: str | os.PathLike[str], public_path: str | os.PathLike[str]
             ) -> None:
        """Write the private key (PKCS#8 PEM, mode 0600, atomically) and the public key
        (SubjectPublicKeyInfo PEM, readable by anyone: it is what the auditor gets)."""
        write_keyring_text(Path(private_path), SecretText(self.__key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode("ascii")))
        Path(public_path).write_bytes(self.public_key().pem())

    def __repr__(self) -> str:
        return f"<SigningKey {self.key_id}>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a signing key is not pickled (it would leave the process in clear)")


def _read_private(path: Path, allow_insecure: bool) -> SecretText:
    """The file's text, after the keyring files' permission check."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Refusal(f"signing key file {path} does not exist") from None
    except OSError as exc:
        raise Refusal(f"signing key file {path} cannot be read: {type(exc).__name__}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refusal(f"signing key {path} is not a regular file")
        if not allow_insecure:
            try:
                check_permissions(path, st, "signing key file")
            except ConfigurationError as exc:
                raise Refusal(str(exc)) from None
        if st.st_size > _MAX_KEY_BYTES:
            raise Refusal(f"{path} is {st.st_size} bytes: not a signing key file")
        raw = os.read(fd, _MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if raw.isascii():
        return SecretText(raw.decode("ascii"))
    raise Refusal(f"{path} is not a PEM file (not ASCII text)")


def _parse_private(text: SecretText, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(text.reveal().encode("utf-8"), password=None)
    except (ValueError, TypeError):
        raise Refusal(f"{where} is not an unencrypted PEM private key (make one with "
                      "`securesaver signing-key`)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise Refusal(f"{where} holds a {type(key).__name__.lstrip('_')}, not an Ed25519 key")
    return key


class PublicKey:
    """The public half: what verifies a signature offline."""

    __slots__ = ("key", "key_id")

    def __init__(self, key: Ed25519PublicKey) -> None:
        self.key = key
        self.key_id = _key_id(key)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PublicKey:
        try:
            with open(path, "rb") as fh:
                data = fh.read(_MAX_PUBLIC_BYTES + 1)
        except OSError as exc:
            raise ConfigurationError(f"cannot read the public key {path}: "
                                     f"{type(exc).__name__}") from None
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            raise ConfigurationError(f"{path} is not a PEM public key (the --public-out file "
                                     "of `securesaver signing-key`)") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigurationError(f"{path} is not an Ed25519 public key")
        return cls(key)

    def pem(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.PEM,
                                     serialization.PublicFormat.SubjectPublicKeyInfo)

    def verifies(self, signature: bytes, message: bytes) -> bool:
        try:
            self.key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def __repr__(self) -> str:
        return f"<PublicKey {self.key_id}>"


def signature_path(document: str | os.PathLike[str]) -> Path:
    """Where the signature of ``document`` is written: beside it, ``.sig`` appended."""
    path = Path(document)
    return path.with_name(path.name + SIG_SUFFIX)


class _Hashing(io.TextIOBase):
    """A text stream onto a binary file that hashes the UTF-8 bytes it writes."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        data = text.encode("utf-8")
        self.digest.update(data)
        self.size += len(data)
        self._raw.write(data)
        return len(text)

    def flush(self) -> None:
        self._raw.flush()


@contextmanager
def signed_file(path: str | os.PathLike[str], kind: str, key: SigningKey | None
                ) -> Iterator[TextIO]:
    """A text stream writing ``path``; when the block ends without an error and ``key`` is
    given, ``path.sig`` is written (a stale signature, from before, is removed first,
    so a failed write leaves no signature that seems to cover the new file)."""
    target = Path(path)
    sig = signature_path(target)
    if key is not None:
        sig.unlink(missing_ok=True)
    with open(target, "wb") as raw:
        stream = _Hashing(raw)
        yield cast(TextIO, stream)
        stream.flush()
        os.fsync(raw.fileno())
    if key is None:
        return
    signed = {"kind": kind, "sha256": stream.digest.hexdigest(), "size": stream.size,
              "signed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "key_id": key.key_id}
    envelope = {"format": SIGNATURE_FORMAT, "signed": signed,
                "signature": base64.b64encode(key.sign(signed_message(signed))).decode()}
    sig.write_bytes(_canonical_envelope(envelope))


def _canonical_envelope(envelope: dict[str, Any]) -> bytes:
    """The one serialization of a signature file (so a changed byte anywhere in it is seen)."""
    return (json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
            + "\n").encode("ascii")


@dataclass
class Verdict:
    """What :func:`verify_file` found: ``ok``, else ``reason`` (one line)."""

    ok: bool
    reason: str = ""
    signed: dict[str, Any] = field(default_factory=dict)


def verify_file(document: str | os.PathLike[str], public: PublicKey,
                signature: str | os.PathLike[str] | None = None) -> Verdict:
    """Check ``document`` against its signature file (default: beside it) with ``public``.
    No database, no keyring. A document that cannot be read raises ConfigurationError (the
    check cannot run); everything else is a :class:`Verdict`."""
    doc = Path(document)
    sig = Path(signature) if signature is not None else signature_path(doc)
    if not doc.is_file():
        raise ConfigurationError(f"no document at {doc}")
    try:
        with open(sig, "rb") as fh:
            raw = fh.read(_MAX_SIG_BYTES + 1)
    except FileNotFoundError:
        return Verdict(False, f"{doc} is not signed: no signature file {sig}")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {sig}: {type(exc).__name__}") from None
    signed, sig_bytes = _envelope(raw)
    if signed is None or sig_bytes is None:
        return Verdict(False, f"{sig} is not a {SIGNATURE_FORMAT} signature (altered?)")
    if signed["key_id"] != public.key_id:
        return Verdict(False, f"signed by another key ({signed['key_id']}; the public key "
                              f"given is {public.key_id})", signed)
    if not public.verifies(sig_bytes, signed_message(signed)):
        return Verdict(False, f"the signature in {sig} does not verify: the signature file "
                              "was altered", signed)
    digest, size = hashlib.sha256(), 0
    try:
        with open(doc, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {doc}: {type(exc).__name__}") from None
    if size != signed["size"] or digest.hexdigest() != signed["sha256"]:
        return Verdict(False, f"{doc} was altered: its bytes are not the ones signed", signed)
    return Verdict(True, "", signed)


def _envelope(raw: bytes) -> tuple[dict[str, Any] | None, bytes | None]:
    """(signed, signature bytes) of a well-formed signature file, else (None, None)."""
    try:
        envelope = json.loads(raw.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(envelope, dict) or set(envelope) != {"format", "signed", "signature"} \
            or envelope["format"] != SIGNATURE_FORMAT:
        return None, None
    signed, text = envelope["signed"], envelope["signature"]
    if not isinstance(signed, dict) or set(signed) != set(_SIGNED_FIELDS) or any(
            type(signed[k]) is not t for k, t in _SIGNED_FIELDS.items()) \
            or not isinstance(text, str):
        return None, None
    try:
        sig_bytes = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None, None
    if len(sig_bytes) != 64 or _canonical_envelope(envelope) != raw:
        return None, None
    return signed, sig_bytes
