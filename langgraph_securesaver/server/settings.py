"""What LangGraph Server's SecureSaver integrations read from the environment
(:class:`ServerSettings`; re-exported by :mod:`.saver`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..keys.keyring import Keyring
from ..keys.provider import KeyProvider
from ..keys.urls import provider_from_url
from ..retention import RetentionPolicy


@dataclass(frozen=True)
class ServerSettings:
    """What :func:`make_checkpointer` reads from the environment."""

    url: str
    keyring: KeyProvider
    redaction: bool = True
    retention: RetentionPolicy | None = None
    tenant_field: str = "identity"
    default_tenant: str | None = None
    #: None: calls name no subject (``SECURESAVER_SUBJECT_FIELD=none``)
    subject_field: str | None = "identity"

    @classmethod
    def from_env(cls) -> ServerSettings:
        env = os.environ
        url = env.get("SECURESAVER_URL", "").strip()
        if not url:
            raise ConfigurationError(
                "set SECURESAVER_URL (sqlite:///path.db or postgresql://...) for the "
                "LangGraph Server checkpointer")
        key_file = env.get("SECURESAVER_KEYRING_FILE", "").strip()
        provider_url = env.get("SECURESAVER_KEY_PROVIDER", "").strip()
        keyring: KeyProvider
        if provider_url:
            keyring = provider_from_url(provider_url)
        elif key_file:
            keyring = Keyring.from_file(key_file)
        else:
            keyring = Keyring.from_env()
        redaction_text = env.get("SECURESAVER_REDACTION", "on").strip().lower()
        if redaction_text not in ("on", "off", "true", "false", "1", "0"):
            raise ConfigurationError(
                f"SECURESAVER_REDACTION must be on or off, got {redaction_text!r}")
        idle = env.get("SECURESAVER_RETENTION_IDLE_TTL") or None
        max_age = env.get("SECURESAVER_RETENTION_MAX_AGE") or None
        strategy = env.get("SECURESAVER_RETENTION_STRATEGY") or "delete"
        retention = (RetentionPolicy(idle_ttl=idle, max_age=max_age, strategy=strategy)
                     if idle or max_age else None)
        default_tenant = env.get("SECURESAVER_DEFAULT_TENANT") or None
        return cls(url=url, keyring=keyring,
                   redaction=redaction_text in ("on", "true", "1"), retention=retention,
                   tenant_field=env.get("SECURESAVER_TENANT_FIELD") or "identity",
                   default_tenant=default_tenant,
                   subject_field=_subject_field(env.get("SECURESAVER_SUBJECT_FIELD")))


def _subject_field(value: str | None) -> str | None:
    text = (value or "").strip()
    if text.lower() == "none":
        return None
    return text or "identity"
