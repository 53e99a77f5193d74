"""``pkcs11://`` URLs: what names a :class:`~.pkcs11_provider.Pkcs11KeyProvider` in a string.

``pkcs11://<token label>/<key label>?module=/path/lib.so&pin-env=VAR`` (or ``pin-file=PATH``;
optional ``max-sessions=N``). Labels are percent-decoded; the PIN itself, or a user, in the
URL is refused. Parsing needs neither python-pkcs11 nor a token.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigurationError

SCHEME = "pkcs11"
#: sessions a provider opens per module and token at most (``max-sessions``)
DEFAULT_SESSIONS = 4


def parse_pkcs11_url(url: str) -> tuple[str, str, dict[str, Any]]:
    """(token label, key label, the provider's keyword options) of a ``pkcs11://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ConfigurationError(f"not a {SCHEME}:// URL")
    if "@" in parts.netloc:
        raise ConfigurationError(
            f"{SCHEME}:// URLs carry no PIN or user: use pin-env=VAR or pin-file=PATH")
    token = unquote(parts.netloc)
    key = unquote(parts.path.lstrip("/"))
    query = parse_qs(parts.query, keep_blank_values=True)
    if "pin-value" in query or "pin" in query:
        raise ConfigurationError(
            f"{SCHEME}:// URLs never carry the PIN itself: use pin-env=VAR or pin-file=PATH")
    unknown = set(query) - {"module", "module-path", "pin-env", "pin-file", "max-sessions"}
    if unknown:
        raise ConfigurationError(
            f"{SCHEME}:// URL: unknown option(s) {', '.join(sorted(unknown))} (known: "
            "module, pin-env, pin-file, max-sessions)")
    module = (query.get("module") or query.get("module-path") or [""])[-1]
    if not token or not key or "/" in key:
        raise ConfigurationError(
            f"{SCHEME}:// URL must name the token and the key: "
            f"{SCHEME}://TOKEN-LABEL/KEY-LABEL?module=...&pin-env=...")
    if not module:
        raise ConfigurationError(f"{SCHEME}:// URL needs module=/path/to/pkcs11-module.so")
    try:
        sessions = int(query.get("max-sessions", [str(DEFAULT_SESSIONS)])[-1])
    except ValueError:
        raise ConfigurationError("max-sessions must be a whole number") from None
    return token, key, {"module": module,
                        "pin_env": query["pin-env"][-1] if "pin-env" in query else None,
                        "pin_file": query["pin-file"][-1] if "pin-file" in query else None,
                        "max_sessions": sessions}
