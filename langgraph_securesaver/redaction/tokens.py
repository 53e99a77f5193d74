"""Tokens and markers: ``<KIND:32 hex>`` tokens (a keyed HMAC of the normalized value, so the
same value always gives the same token per tenant) and ``<KIND:masked>`` markers.

Pure functions of their inputs; no state.
"""

from __future__ import annotations

import hmac
import marshal
import re
from collections.abc import Sequence
from typing import Any

from ..keys.material import SecretBytes
from .normalize import DEFAULT_PHONE_REGIONS, normalize_value

# --------------------------------------------------------------------------------------------
# Tokens and markers
# --------------------------------------------------------------------------------------------
TOKEN_HEX_CHARS = 32
TOKEN_RE = re.compile(r"<([A-Z][A-Z0-9_]{0,63}):([0-9a-f]{32})>")
_KIND_SAFE = re.compile(r"[^A-Z0-9_]")
_TOKEN_DOMAIN = b"langgraph-securesaver/redaction/token/v1\x00"


def kind_label(kind: str) -> str:
    label = _KIND_SAFE.sub("_", kind.upper())[:64] or "PII"
    return label if label[0].isalpha() else "PII_" + label[:59]


def make_token(token_key: SecretBytes | bytes, kind: str, value: str,
               regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> str:
    """``<KIND:hex>`` with hex = the first 128 bits of HMAC-SHA256(key, kind, normalized value)
    (:func:`.normalize.normalize_value`; phone numbers read in ``regions``).

    A :class:`SecretBytes` key is revealed only as the argument of the HMAC call: no frame of
    the redaction path holds the raw key (a ``bytes`` key is the caller's own frame's)."""
    label = kind_label(kind)
    msg = (_TOKEN_DOMAIN + label.encode("ascii") + b"\x00"
           + normalize_value(kind, value, regions).encode("utf-8", "surrogatepass"))
    digest = hmac.digest(token_key.reveal() if isinstance(token_key, SecretBytes) else token_key,
                         msg, "sha256").hex()[:TOKEN_HEX_CHARS]
    return f"<{label}:{digest}>"


def mask_marker(kind: str) -> str:
    return f"<{kind_label(kind)}:masked>"


# tokens in messages read back, found on a marshal dump (restore's per-conversation cache)
_TOKEN_BYTES_RE = re.compile(rb"<[A-Z][A-Z0-9_]{0,63}:[0-9a-f]{32}>")


def dump_message(msg: Any) -> bytes | None:
    """A marshal dump of a message's fields, or None if it has an unmarshalable field or is
    nested too deeply (callers then walk it)."""
    fields = getattr(msg, "__dict__", None)
    if not isinstance(fields, dict):
        return None
    try:
        return marshal.dumps((tuple(fields.values()),
                              getattr(msg, "__pydantic_extra__", None)), 0)
    except ValueError:
        return None


def tokens_in_dump(dumped: bytes) -> list[str]:
    """Tokens in a marshal dump (strings are UTF-8 there, so tokens appear verbatim)."""
    if b"<" not in dumped:
        return []
    return [t.decode("ascii") for t in _TOKEN_BYTES_RE.findall(dumped)]
