"""How a failed PKCS#11 call is classified by :class:`~.pkcs11_provider.Pkcs11KeyProvider`.

A refusal of the data (a wrong tag, a destroyed key) becomes :class:`TamperedDataError`, a
token that cannot do what is asked a :class:`ConfigurationError`, anything else a device
failure (:class:`KeyProviderUnavailable`, retried once). This module names the library's
errors; the provider decides with them (and with whether the token still answers).
"""

from __future__ import annotations

from typing import Any

from .pkcs11_pool import error_name


class MissingKeyObject(Exception):
    """A key object of this family is not in the token (classified by the caller)."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


def fresh_error(exc: Exception) -> Exception:
    """A fresh error of the same type and message (no traceback into the library)."""
    fresh = type(exc).__new__(type(exc))
    fresh.args = exc.args
    return fresh


#: errors that say the data (ciphertext, tag, length) is refused
_DATA = ("EncryptedDataInvalid", "EncryptedDataLenRange", "DataInvalid", "DataLenRange")
#: errors some modules (SoftHSM2) also give for a wrong tag: data only if the token is fine
_MAYBE_DATA = ("GeneralError", "FunctionFailed")
_CONFIG = ("MechanismInvalid", "MechanismParamInvalid", "KeyFunctionNotPermitted",
           "KeyTypeInconsistent", "FunctionNotSupported")


def error_kind(exc: BaseException, pkcs11: Any) -> str:
    """``data`` (the token refuses the ciphertext), ``maybe-data`` (a wrong tag on some
    modules, a device glitch on others), ``config`` (the token or key cannot do AES-GCM) or
    ``device`` (anything else: the module or token failed)."""
    name = error_name(exc)
    if name in _DATA:
        return "data"
    if name in _MAYBE_DATA:
        return "maybe-data"
    if name in _CONFIG:
        return "config"
    return "device"
