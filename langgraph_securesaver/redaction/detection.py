"""Detection: where the PII is in one text. The analysis view is built, the engine's
recognizers run on it (pattern recognizers first, NER where the policy asks), data URLs are
decoded and analyzed, overlaps resolved, and the spans mapped back to the original text.

:class:`Detection` is a base class of :class:`~.redactor.Redactor` (it uses the redactor's
engine, policy limits and clock); it knows nothing of values, walking, tokens or restore.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from presidio_analyzer import AnalyzerEngine, RecognizerResult

from ..keys.material import SecretBytes
from .decoding import DECODABLE, decoded_view
from .engine import (
    LANGUAGE,
)
from .errors import RedactionError
from .policy import Action, RedactionPolicy
from .recognizers import API_SECRET, CANDIDATE_RE, label_veto, private_key_spans
from .tokens import (
    make_token,
    mask_marker,
)
from .types import (
    Entity,
    VaultEntry,
)
from .view import (
    BLANK,
    DATA_URL,
    EMBEDDED_PII,
    MARKER_RE,
    PRIORITY,
    SECRET_OVERLAP,
    blank_markers,
    decode_payload,
    fold_text,
    map_span,
)

logger = logging.getLogger("langgraph_securesaver.redaction.redactor")


class Overrun(Exception):  # internal control flow: never escapes the redactor
    """The analysis of one value ran past its time budget."""


class Detection:
    """The detection half of the Redactor (see the module docstring)."""

    _artifacts: Any
    _clock: Callable[[], float]
    _known_labels: frozenset[str] | None
    _ner_entities: Any
    _pattern_entities: Any
    _prefilter: Any
    _phone_regions: tuple[str, ...]

    @property
    def phone_regions(self) -> tuple[str, ...]:
        """The regions phone numbers are recognized and normalized (E.164) in."""
        return self._phone_regions

    @property
    def analyzer(self) -> AnalyzerEngine:
        raise NotImplementedError

    def _ensure_engine(self) -> None:
        raise NotImplementedError

    def _analyze(self, text: str, entities: Sequence[str],
                 threshold: float) -> list[RecognizerResult]:
        if not entities:
            return []
        results: list[RecognizerResult] = self.analyzer.analyze(
            text=text, language=LANGUAGE, entities=list(entities),
            nlp_artifacts=self._artifacts, score_threshold=threshold)
        return results

    def _detect(self, text: str, policy: RedactionPolicy) -> list[Entity]:
        return self._finish(text, self._raw_detect(text, policy), policy)

    def _raw_detect(self, text: str, policy: RedactionPolicy,
                    deadline: float | None = None,
                    nested: bool = False) -> dict[tuple[str, int, int], float]:
        """{(kind, start, end): score} for every detection in ``text``, before filtering.

        Raises ``Overrun`` once the analysis has taken longer than the policy's budget
        (``time_budget`` seconds per ``max_chars`` characters, at least one unit)."""
        if len(text) > policy.hard_max_chars:
            raise RedactionError(
                f"a {len(text)}-character string exceeds hard_max_chars="
                f"{policy.hard_max_chars}; it was not stored. Raise the limit in the policy or "
                "keep such payloads out of the graph state")
        self._ensure_engine()
        clock = self._clock
        if deadline is None:
            units = max(1, -(-len(text) // policy.max_chars))
            deadline = clock() + policy.time_budget * units

        def check() -> None:
            if clock() > deadline:
                raise Overrun("time budget")
            if len(found) > policy.max_detections:
                raise Overrun("detection cap")

        pattern_entities = self._pattern_entities or ()
        folded, offsets = fold_text(text)
        view = blank_markers(folded, self._known_labels)
        threshold = policy.score_threshold
        found: dict[tuple[str, int, int], float] = {}

        def collect(results: Sequence[RecognizerResult], offset: int = 0) -> None:
            for r in results:
                start, end = map_span(offsets, r.start + offset, r.end + offset)
                k = (r.entity_type, start, end)
                if found.get(k, -1.0) < r.score:
                    found[k] = r.score

        if "base64," in view:
            view = self._data_urls(view, policy, deadline, nested, collect)
        if len(view) <= policy.max_chars:
            if not (self._prefilter and CANDIDATE_RE.search(view) is None):
                collect(self._analyze(view, pattern_entities, threshold))
                check()
        else:
            # Chunks overlap by SECRET_OVERLAP characters, so that any value shorter than that
            # is whole in some chunk; private-key blocks (longer) get one pass of their own.
            # Every regex call then scans at most max_chars characters: the GIL is released
            # often enough for the event loop of an async caller to keep running.
            logger.debug("analyzing a %d-character string in chunks of %d", len(text),
                         policy.max_chars)
            step = policy.max_chars - min(SECRET_OVERLAP, policy.max_chars // 2)
            for start in range(0, len(view), step):
                chunk = view[start:start + policy.max_chars]
                if not (self._prefilter and CANDIDATE_RE.search(chunk) is None):
                    collect(self._analyze(chunk, pattern_entities, threshold), start)
                    check()
                time.sleep(0)  # hand the GIL over between chunks (an event loop may wait)
                if start + policy.max_chars >= len(view):
                    break
            if API_SECRET in pattern_entities:
                collect([RecognizerResult(API_SECRET, s, e, score)
                         for s, e, score in private_key_spans(view)])
                check()
        if not nested and DECODABLE.search(text) is not None:
            self._decoded(text, policy, deadline, found)
            check()
        if self._ner_entities and not nested:
            ner_text = MARKER_RE.sub(lambda m: " " * len(m.group(0)), text)
            for r in self.analyzer.analyze(text=ner_text, language=LANGUAGE,
                                           entities=list(self._ner_entities),
                                           score_threshold=threshold):
                k = (r.entity_type, r.start, r.end)
                if found.get(k, -1.0) < r.score:
                    found[k] = r.score
            check()
        return found

    def _decoded(self, text: str, policy: RedactionPolicy, deadline: float,
                 found: dict[tuple[str, int, int], float]) -> None:
        """Analyze the percent- and HTML-reference-decoded view too; a detection there is
        reported on the span of the original characters it was decoded from."""
        clock = self._clock
        view = decoded_view(text, lambda: clock() > deadline)
        if view is None:
            return
        decoded, starts, ends = view
        for (kind, s, e), score in self._raw_detect(decoded, policy, deadline, True).items():
            if e <= s:
                continue
            k = (kind, starts[s], ends[e - 1])
            if found.get(k, -1.0) < score:
                found[k] = score

    def _data_urls(self, view: str, policy: RedactionPolicy, deadline: float, nested: bool,
                   collect: Callable[[Sequence[RecognizerResult]], None]) -> str:
        """Decode each data URL's base64 payload: a payload whose text holds anything
        detectable is reported whole as ``EMBEDDED_PII``; the payload is then blanked in the
        view (base64 is not text), and what follows it is analyzed as usual."""
        parts: list[str] = []
        pos = 0
        for m in DATA_URL.finditer(view):
            start, end = m.span("p")
            decoded = None if nested else decode_payload(m.group("p"))
            if decoded is not None and self._raw_detect(decoded, policy, deadline, True):
                collect([RecognizerResult(EMBEDDED_PII, start, end, 1.0)])
            parts.append(view[pos:start])
            parts.append(BLANK * (end - start))
            pos = end
        if not parts:
            return view
        parts.append(view[pos:])
        return "".join(parts)

    @staticmethod
    def _finish(text: str, found: Mapping[tuple[str, int, int], float],
                policy: RedactionPolicy) -> list[Entity]:
        """Apply the allowlist and label vetoes, then resolve overlaps."""
        candidates = []
        for (kind, start, end), score in found.items():
            value = text[start:end]
            if (not value.strip() or policy.is_allowed(value)
                    or label_veto(kind, text, start, end)):
                continue
            candidates.append(Entity(kind, start, end, score, value))
        return _resolve_overlaps(candidates)

    def _apply(self, text: str, entities: Sequence[Entity], policy: RedactionPolicy,
               key: SecretBytes) -> tuple[str, list[VaultEntry]]:
        parts: list[str] = []
        vault: dict[str, VaultEntry] = {}
        pos = 0
        for e in entities:
            action = policy.action_for(e.kind)
            if action is Action.KEEP:
                continue
            parts.append(text[pos:e.start])
            if action is Action.TOKENIZE:
                token = make_token(key, e.kind, e.text, self.phone_regions)
                parts.append(token)
                vault.setdefault(token, VaultEntry(token, e.kind, e.text))
            elif action is Action.MASK:
                parts.append(mask_marker(e.kind))
            pos = e.end
        if not parts:
            return text, []
        parts.append(text[pos:])
        return "".join(parts), list(vault.values())


def _resolve_overlaps(candidates: list[Entity]) -> list[Entity]:
    """Keep the best of overlapping detections: higher score, longer span, then priority."""
    ranked = sorted(candidates, key=lambda e: (-e.score, -(e.end - e.start),
                                               -PRIORITY.get(e.kind, 1), e.start))
    starts: list[int] = []  # sorted, non-overlapping accepted spans
    taken: list[Entity] = []
    for e in ranked:
        i = bisect.bisect_right(starts, e.start)
        if i > 0 and taken[i - 1].end > e.start:
            continue
        if i < len(taken) and taken[i].start < e.end:
            continue
        starts.insert(i, e.start)
        taken.insert(i, e)
    return taken
