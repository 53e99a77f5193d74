"""Key material as a type: values whose ``repr``/``str`` reveal nothing.

Error reporters that show locals (Sentry, rich, structlog, ``traceback`` with
``capture_locals=True``) print the ``repr`` of every local of every frame an exception passed
through. Master keys, tenant KEKs, data, index and MAC keys, and the environment or file text
that carries them are therefore held in :class:`SecretBytes` / :class:`SecretText`, and code
that needs the raw value calls :meth:`~SecretBytes.reveal` inside the expression that uses it,
so no frame keeps the raw value in a local.

Parsing such text can fail half-way, with raw pieces in locals. :func:`refusing_outside` runs
the parser and raises its refusal only after the parser's frame is gone: the error a caller
sees has no traceback into it and no chained exception.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import NoReturn, TypeVar

from ..errors import ConfigurationError, SecureSaverError

T = TypeVar("T")


class SecretBytes:
    """Raw key bytes that do not print. Compare in constant time; never pickle or hash."""

    __slots__ = ("__value",)

    def __init__(self, value: bytes | bytearray | memoryview | SecretBytes) -> None:
        raw = value.reveal() if isinstance(value, SecretBytes) else bytes(value)
        self.__value = raw

    def reveal(self) -> bytes:
        """The raw bytes; use inside the expression that needs them, never store in a local
        of a function that can raise."""
        return self.__value

    def __len__(self) -> int:
        return len(self.__value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SecretBytes):
            return NotImplemented
        return hmac.compare_digest(self.__value, other.reveal())

    __hash__ = None  # type: ignore[assignment]  # a key is not a dict key: hashing leaks timing

    def __repr__(self) -> str:
        return f"<SecretBytes: {len(self.__value)} bytes>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material is not pickled (it would leave the process in clear)")

    def __copy__(self) -> SecretBytes:
        return self

    def __deepcopy__(self, memo: object) -> SecretBytes:
        return self


class SecretText:
    """Text that carries key material (an environment value, a keyring file's contents)."""

    __slots__ = ("__value",)

    def __init__(self, value: str) -> None:
        self.__value = str(value)

    def reveal(self) -> str:
        return self.__value

    def __len__(self) -> int:
        return len(self.__value)

    def __bool__(self) -> bool:
        return bool(self.__value)

    def __repr__(self) -> str:
        return f"<SecretText: {len(self.__value)} characters>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material is not pickled (it would leave the process in clear)")


class Refusal(Exception):
    """Raised inside a parser of key material; :func:`refusing_outside` re-raises it as
    ``kind(message)`` from a frame that holds nothing of the input."""

    def __init__(self, message: str, kind: type[Exception] = ConfigurationError) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


def refusing_outside(parse: Callable[..., T], *args: object) -> T:
    """``parse(*args)``; whatever it raises is raised again from here, after the except
    block, so the error the caller sees has no context, its traceback starts here, and the
    frames of ``parse`` (with whatever raw pieces they held) are freed:

    * a :class:`Refusal` becomes ``refusal.kind(message)``;
    * one of the library's own errors becomes a fresh error of the same type and message;
    * anything else (a bug, a recursion limit) becomes a :class:`ConfigurationError` naming
      only its type: its message could quote the input.

    Only the arguments appear in this frame: pass key material wrapped."""
    try:
        return parse(*args)
    except Refusal as refusal:
        error: Exception = refusal.kind(refusal.message)
    except SecureSaverError as exc:
        error = type(exc).__new__(type(exc))
        error.args = exc.args
    except Exception as exc:  # noqa: BLE001 - its message and frames may hold the input
        error = ConfigurationError(
            f"key material could not be parsed ({type(exc).__name__})")
    raise error from None
