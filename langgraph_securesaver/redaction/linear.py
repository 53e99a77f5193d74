"""The base of every built-in recognizer: :class:`LinearRecognizer` runs a few compiled
standard-library patterns (:class:`Rx`) whose running time is linear in the text, on the
redactor's analysis view (see :mod:`.recognizers` for the rules the patterns follow).

Knows presidio's recognizer interface; no entity-specific logic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from presidio_analyzer import EntityRecognizer, RecognizerResult

CN_RESIDENT_ID = "CN_RESIDENT_ID"
CN_MOBILE = "CN_MOBILE"
API_SECRET = "API_SECRET"  # noqa: S105 - an entity name

# A validator gets (match, view) and returns the score to report, or None to drop the match.
Validator = Callable[["re.Match[str]", str], "float | None"]


@dataclass(frozen=True)
class Rx:
    """One pattern: the span reported is group ``group`` of each match."""

    name: str
    regex: re.Pattern[str]
    score: float
    validate: Validator | None = None
    group: int | str = 0
    needles: tuple[str, ...] = ()  # the pattern can only match text holding one of these
    fold_case: bool = False  # needles are compared with the lower-cased text


def rx(name: str, pattern: str, score: float, validate: Validator | None = None,
       group: int | str = 0, flags: int = 0, needles: tuple[str, ...] = (),
       fold_case: bool = False) -> Rx:
    return Rx(name, re.compile(pattern, flags | re.ASCII), score, validate, group, needles,
              fold_case)


class LinearRecognizer(EntityRecognizer):
    """A recognizer made of linear-time standard-library patterns (see the module doc)."""

    ENTITY = "PII"
    PATTERNS: Sequence[Rx] = ()

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=[self.ENTITY], name=type(self).__name__,
                         supported_language=supported_language)

    def load(self) -> None:
        return None

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        if entities and self.ENTITY not in entities:
            return []
        results: list[RecognizerResult] = []
        lower: str | None = None
        for p in self.PATTERNS:
            if p.needles:  # a substring test is far cheaper than a regex scan
                if p.fold_case:
                    lower = text.lower() if lower is None else lower
                    if not any(n in lower for n in p.needles):
                        continue
                elif not any(n in text for n in p.needles):
                    continue
            for m in p.regex.finditer(text):
                start, end = m.span(p.group)
                if start >= end:
                    continue
                score = p.score if p.validate is None else p.validate(m, text)
                if score is None or score <= 0:
                    continue
                results.append(RecognizerResult(self.ENTITY, start, end, score))
        return results
