"""Personal data and secrets in clear values: what the at-rest scan checks every clear column,
metadata value and row key with (the redaction recognizers, cached per distinct string), and
how it masks them where a location would show them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError


class ClearTextInspector:
    """Finds personal data and secrets in clear strings (cached per distinct string) and
    masks them for display."""

    MAX_CHARS = 20_000
    MAX_CACHE = 200_000

    def __init__(self, redactor: Any = None) -> None:
        if redactor is None:
            try:
                from ..redaction import Redactor
            except ImportError as exc:
                raise ConfigurationError(
                    "the scan uses langgraph_securesaver.redaction to find personal data, and "
                    f"it could not be imported: {exc}") from None
            redactor = Redactor()
        self.redactor = redactor
        self._cache: dict[str, tuple[tuple[str, int, int], ...]] = {}

    def entities(self, text: str) -> tuple[tuple[str, int, int], ...]:
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        if len(text) < 3 or (text.isdigit() and len(text) < 7):
            found: tuple[tuple[str, int, int], ...] = ()
        else:
            result = self.redactor.redact(text[:self.MAX_CHARS])
            found = tuple((e.kind, e.start, e.end) for e in result.entities)
        if len(self._cache) > self.MAX_CACHE:
            self._cache.clear()
        self._cache[text] = found
        return found

    def kinds(self, text: str) -> list[str]:
        return sorted({k for k, _s, _e in self.entities(text)})

    def kinds_in(self, value: Any) -> list[str]:
        """Kinds found in any string (or number) inside a JSON-like value, keys included."""
        found: set[str] = set()
        for leaf in _leaves(value):
            found.update(self.kinds(leaf))
        return sorted(found)

    def mask(self, text: str, limit: int = 80) -> str:
        """``text`` with detected values replaced by ``<KIND>`` (for locations)."""
        out, last = [], 0
        for kind, start, end in sorted(self.entities(text), key=lambda e: e[1]):
            if start < last:
                continue
            out.append(text[last:start])
            out.append(f"<{kind}>")
            last = end
        out.append(text[last:])
        masked = "".join(out)
        return masked if len(masked) <= limit else masked[:limit - 1] + "…"


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        parsed = None
        if value[:1] in "{[":
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
        if isinstance(parsed, (dict, list)):
            yield from _leaves(parsed)
        else:
            yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield str(value)
