"""The serializer SecureSaver installs on every inner saver: it can evaluate nothing.

An inner LangGraph saver decodes its rows with its own ``serde`` *before* SecureSaver sees them
(SQLite: the checkpoint document and pending writes; PostgreSQL: ``checkpoint_blobs`` and
``checkpoint_writes``; InMemory: everything). LangGraph's default ``JsonPlusSerializer`` turns
msgpack extension types, ``"json"`` constructor documents and (optionally) pickles into imports
and calls, so a row edited by someone with database write access would run code inside
``get_tuple`` before any ciphertext is checked.

SecureSaver seals every value itself, so what an inner saver stores is only ever sealed bytes
and the plain containers around them (the checkpoint document: strings, numbers, lists, maps,
bytes). :class:`StrictSerializer` encodes and decodes exactly that:

* ``"bytes"`` and ``"null"`` as ``JsonPlusSerializer`` does (so rows written before are read);
* ``"msgpack"`` with *no* extension types: an extension type (LangGraph's constructor, method,
  pydantic, numpy and delta-snapshot payloads alike) is refused while the bytes are parsed, and
  nothing it names is imported or called;
* anything else (``"json"``, ``"pickle"``, ``"bytearray"``, ``"msgpack+cipher"``, unknown tags)
  is refused without looking at the bytes.

Every refusal is a :class:`~langgraph_securesaver.errors.TamperedDataError` that never quotes
the stored bytes. Which serializers of an inner saver it replaces, and which savers are refused
because their decoding cannot be made strict, is :mod:`.strict_decoding`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..errors import TamperedDataError

__all__ = ["StrictSerializer", "Unevaluated", "inspect_msgpack", "safe_tag"]

_MSGPACK_OPTIONS = ormsgpack.OPT_NON_STR_KEYS
_TAG_RE = re.compile(r"^[A-Za-z0-9_+.\-]{1,32}$")


def safe_tag(type_: object) -> str:
    """A stored type tag, fit for an error message (attacker-controlled: shown only if short
    and plain)."""
    text = type_ if isinstance(type_, str) else (
        type_.decode("ascii", "replace") if isinstance(type_, bytes) else repr(type(type_)))
    return repr(text) if _TAG_RE.match(text) else "<unprintable type tag>"


class StrictSerializer(SerializerProtocol):
    """Bytes, None and plain msgpack containers; everything else is refused (see module doc)."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None:
            return "null", b""
        if isinstance(obj, bytes):
            return "bytes", obj
        try:
            return "msgpack", ormsgpack.packb(obj, option=_MSGPACK_OPTIONS)
        except (TypeError, ormsgpack.MsgpackEncodeError) as exc:
            raise TypeError(
                f"the inner saver was asked to store a {type(obj).__name__} that is not a plain "
                "container; SecureSaver only hands its inner saver sealed bytes and plain "
                "containers") from exc

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        try:
            type_, raw = data
        except (TypeError, ValueError):
            raise TamperedDataError("a stored row has no (type, bytes) pair") from None
        if type_ == "bytes":
            if not isinstance(raw, (bytes, bytearray, memoryview)):
                raise TamperedDataError("a stored 'bytes' row holds no bytes")
            return bytes(raw)
        if type_ == "null":
            return None
        if type_ == "msgpack":
            if not isinstance(raw, (bytes, bytearray, memoryview)):
                raise TamperedDataError("a stored 'msgpack' row holds no bytes")
            ext: list[int] = []

            def refuse_ext(code: int, _data: bytes) -> Any:
                ext.append(int(code))
                raise ValueError("extension type")  # aborts the parse; nothing is evaluated

            try:
                return ormsgpack.unpackb(raw, ext_hook=refuse_ext, option=_MSGPACK_OPTIONS)
            except (ValueError, TypeError, ormsgpack.MsgpackDecodeError):
                if ext:
                    raise TamperedDataError(
                        f"a stored row holds a msgpack extension type ({ext[0]}); SecureSaver "
                        "never writes one, so it was injected: refused without evaluating it"
                    ) from None
                raise TamperedDataError(
                    "a stored msgpack row does not parse (altered bytes)") from None
        raise TamperedDataError(
            f"a stored row has type tag {safe_tag(type_)}, which SecureSaver never writes "
            "(only sealed bytes and plain msgpack containers): refused without decoding it")


@dataclass(frozen=True)
class Unevaluated:
    """A msgpack extension found by an inspection (scan, audit): kept as bytes, never run."""

    code: int
    data: bytes

    def __repr__(self) -> str:
        return f"<unevaluated msgpack extension {self.code}, {len(self.data)} bytes>"


def inspect_msgpack(raw: bytes) -> Any:
    """Parse a msgpack document for inspection only: extension types become
    :class:`Unevaluated` placeholders (nothing is imported or called). Raises
    TamperedDataError if the bytes do not parse."""
    try:
        return ormsgpack.unpackb(raw, ext_hook=lambda code, data: Unevaluated(code, bytes(data)),
                                 option=_MSGPACK_OPTIONS)
    except (ValueError, TypeError, ormsgpack.MsgpackDecodeError):
        raise TamperedDataError("a stored msgpack row does not parse (altered bytes)") from None
