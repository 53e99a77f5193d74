"""PII and secret redaction for LangGraph state.

Importing this package makes tldextract offline (``TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS=""``
unless already set): the email recognizer validates domains against tldextract's bundled
public-suffix snapshot and never fetches the list. The presidio engine is built lazily, once
per process, on the first redaction.

May import: the foundation modules and :mod:`..keys` (key material); the per-turn path, the
operations and the saver import this package, never the reverse.
"""

from __future__ import annotations

import os

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")

from .engine import (
    DEFAULT_PHONE_REGIONS,
    PATTERN_ENTITIES,
    build_analyzer,
    spacy_ner_engine,
)
from .errors import RedactionError
from .policy import Action, RedactionPolicy
from .redactor import Entity, RedactionResult, RedactionStats, Redactor, VaultEntry
from .tokens import TOKEN_RE, make_token

__all__ = [
    "DEFAULT_PHONE_REGIONS",
    "PATTERN_ENTITIES",
    "TOKEN_RE",
    "Action",
    "Entity",
    "RedactionError",
    "RedactionPolicy",
    "RedactionResult",
    "RedactionStats",
    "Redactor",
    "VaultEntry",
    "build_analyzer",
    "make_token",
    "spacy_ner_engine",
]
