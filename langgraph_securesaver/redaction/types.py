"""The public value types of redaction: a detected :class:`Entity`, a :class:`VaultEntry`
(token -> original), a :class:`RedactionResult`, and the :class:`RedactionStats` counters.

Data only.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    """One detected value: its kind, its span in the analyzed text, the score and the text."""

    kind: str
    start: int
    end: int
    score: float
    text: str


@dataclass(frozen=True)
class VaultEntry:
    """The original value behind a ``TOKENIZE`` replacement (what the saver encrypts)."""

    token: str
    kind: str
    value: str


@dataclass(frozen=True)
class RedactionResult:
    """The redacted text, every detection that survived filtering (including ``KEEP`` ones),
    and the vault entries for the tokens in ``text``."""

    text: str
    entities: list[Entity]
    vault: list[VaultEntry] = field(default_factory=list)


class RedactionStats:
    """Thread-safe counters for one :class:`Redactor` (read them, or ``reset()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset_unlocked()

    def _reset_unlocked(self) -> None:
        self.chars_analyzed = 0  # characters handed to the analyzer
        self.values_analyzed = 0  # strings handed to the analyzer (cache misses)
        self.values_seen = 0  # strings visited (hits, misses and trivially clean ones)
        self.cache_hits = 0
        self.entities_found: Counter[str] = Counter()

    def reset(self) -> None:
        with self._lock:
            self._reset_unlocked()

    def record(self, *, seen: int = 0, hits: int = 0, analyzed: int = 0, chars: int = 0,
               entities: Sequence[Entity] = ()) -> None:
        """Count one redaction call (the redactor calls this once per call, under the lock)."""
        with self._lock:
            self.values_seen += seen
            self.cache_hits += hits
            self.values_analyzed += analyzed
            self.chars_analyzed += chars
            for e in entities:
                self.entities_found[e.kind] += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "chars_analyzed": self.chars_analyzed,
                "values_analyzed": self.values_analyzed,
                "values_seen": self.values_seen,
                "cache_hits": self.cache_hits,
                "entities_found": dict(self.entities_found),
            }

    def __repr__(self) -> str:
        return f"RedactionStats({self.as_dict()})"
