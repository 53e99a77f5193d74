"""Key providers named by URL strings (``keyring="aws-kms://alias/securesaver?region=..."``,
``keyring="pkcs11://token/key?module=...&pin-env=..."``),
so ``SecureSaver``, ``from_url``, the CLI's ``--keyring`` and LangGraph Server's
``SECURESAVER_KEY_PROVIDER`` accept a provider the same way. Provider modules (and their
optional dependencies) are imported only when their scheme is used."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigurationError

#: URL scheme -> module holding a provider class with ``from_url``
SCHEMES = {"aws-kms": ("aws_kms", "AwsKmsKeyProvider"),
           "pkcs11": ("pkcs11_provider", "Pkcs11KeyProvider")}


def is_provider_url(value: object) -> bool:
    return isinstance(value, str) and "://" in value


def provider_from_url(url: str) -> Any:
    """The provider a URL names; :class:`ConfigurationError` for an unknown scheme."""
    scheme = url.split("://", 1)[0].lower()
    entry = SCHEMES.get(scheme)
    if entry is None:
        raise ConfigurationError(
            f"unknown key provider scheme {scheme!r}:// (known: "
            f"{', '.join(s + '://' for s in sorted(SCHEMES))}; a keyring file is a plain path)")
    import importlib
    module = importlib.import_module(f".{entry[0]}", __package__)
    return getattr(module, entry[1]).from_url(url)


def load_provider(spec: str | os.PathLike[str] | None) -> Any:
    """A provider URL, a keyring file path, or None (the ``SECURESAVER_MASTER_KEY`` keyring)."""
    from .keyring import Keyring
    if spec is not None and is_provider_url(str(spec)):
        return provider_from_url(str(spec))
    return Keyring.load(spec)
