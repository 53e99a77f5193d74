"""Analysis in batches: the many strings of one list or JSON document in a few analyzer
calls.

One analyzer call costs ~0.3 ms of fixed overhead (and, in a worker, a round trip), so a
value of thousands of short strings analyzed one by one spends its whole budget on overhead.
The strings are joined by :data:`~.windows.BATCH_SEP`, which no recognizer matches across and
at which every validator's context window stops, and each detection is split back onto the
strings it covers; each string's result is cached, so the per-string walk that follows finds
it there. A custom analyzer's strings are never batched (its patterns may anchor on a whole
value, its NER read a neighbour).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .caches import Cache, Cached
from .offload import BudgetedDetection, InFlight
from .types import Entity
from .view import looks_like_json, may_have_pii
from .walker import Walker
from .windows import BATCH_SEP


class BatchedAnalysis(BudgetedDetection):
    """The batching half of the redactor (see the module docstring); ``call`` is the
    redactor's per-call state."""

    _text_cache: Cache

    def _store_plain(self, s: str, entities: list[Entity], call: Any) -> Cached:
        raise NotImplementedError

    def _redact_str_list(self, strings: Sequence[str], depth: int,
                         on_str: Callable[[str, int, bool], str], call: Any) -> Sequence[str]:
        """The strings of one list (tuple, set): the uncached ones are analyzed in batches
        first (one analyzer call per ``max_chars`` characters, not one per string)."""
        if call.free is None:
            self._prefetch_strings(strings, call)
        out = [on_str(s, depth, False) for s in strings]
        return strings if all(map(operator.is_, out, strings)) else out

    def _prefetch_strings(self, strings: Iterable[str], call: Any) -> None:
        """Batch the analysis of the uncached strings of a list (see
        :meth:`_analyze_in_batches`)."""
        limit = call.policy.max_chars // 4
        self._analyze_in_batches(
            (s for s in strings
             if (s and len(s) <= limit and not looks_like_json(s)
                 and self._text_cache.get((call.ctx, s)) is None
                 and (self._custom_analyzer or may_have_pii(s)))), call)

    def _analyze_in_batches(self, texts: Iterable[str], call: Any) -> None:
        """Analyze ``texts`` in batches of up to ``max_chars`` characters, in order; each
        string is charged to the write once (RedactionError past its budget). What a tenant
        read back (``call.unbilled``) is not charged."""
        if self._custom_analyzer:
            return  # a user's recognizers (anchors, NER, context words) may read across strings
        # one batch in flight: while a worker analyzes batch k+1, this thread finishes batch k
        flight: tuple[list[str], InFlight] | None = None
        try:
            for batch in self._batches(texts, call.policy.max_chars):
                prev, flight = flight, None  # _next_batch collects or drops it
                flight = self._next_batch(batch, call, prev)
            if flight is not None:
                done, flight = flight, None
                self._finish_batch(done[0], self._end_detect(done[1]), call)
        finally:
            if flight is not None:  # a batch failed (or was refused) while this one ran
                self._abandon_detect(flight[1])

    @staticmethod
    def _batches(texts: Iterable[str], limit: int) -> Iterator[list[str]]:
        """``texts`` cut into batches of up to ``limit`` characters. A lone last string is
        left to be analyzed on its own."""
        batch: list[str] = []
        size = 0
        for s in texts:
            if batch and size + len(s) + len(BATCH_SEP) > limit:
                yield batch
                batch, size = [], 0
            batch.append(s)
            size += len(s) + len(BATCH_SEP)
        if len(batch) > 1:
            yield batch

    def _next_batch(self, texts: list[str], call: Any,
                    flight: tuple[list[str], InFlight] | None
                    ) -> tuple[list[str], InFlight] | None:
        """Collect the answer for the batch in ``flight`` (its worker is free again), hand
        ``texts`` to a worker, then finish the collected batch while the worker analyzes;
        returns the new batch if a worker took it (None if it was analyzed here)."""
        found = self._end_detect(flight[1]) if flight is not None else None
        begun = self._begin_detect(BATCH_SEP.join(texts), call.policy, call.spend,
                                   call.unbilled > 0, texts)
        if flight is not None and found is not None:
            try:
                self._finish_batch(flight[0], found, call)
            except BaseException:
                if isinstance(begun, InFlight):
                    self._abandon_detect(begun)
                raise
        if isinstance(begun, InFlight):
            return texts, begun
        self._finish_batch(texts, begun, call)
        return None

    def _prefetch(self, parsed: Any, call: Any, depth: int) -> None:
        """Analyze the uncached strings of ``parsed`` (a parsed JSON document, a message's
        content parts) in a few batched analyzer calls (one call per string costs ~0.3 ms of
        fixed overhead, and a round trip to a worker), filling the cache."""
        pending: dict[str, None] = {}

        def on_str(s: str, _depth: int, is_key: bool) -> str:
            if (s and (is_key or not looks_like_json(s))
                    and len(s) <= call.policy.max_chars // 4
                    and self._text_cache.get((call.ctx, s)) is None
                    and (self._custom_analyzer or may_have_pii(s))):
                pending[s] = None
            return s

        Walker(on_str, max_depth=call.policy.max_depth).walk(parsed, depth)
        if len(pending) >= 2:
            self._analyze_in_batches(pending, call)

    def _finish_batch(self, texts: list[str], found: dict[tuple[str, int, int], float],
                      call: Any) -> None:
        """Split the detections of a batch onto its strings and cache each string's result."""
        starts: list[int] = []
        pos = 0
        for text in texts:
            starts.append(pos)
            pos += len(text) + len(BATCH_SEP)
        per_text: list[dict[tuple[str, int, int], float]] = [{} for _ in texts]
        for (kind, start, end), score in found.items():
            i = bisect.bisect_right(starts, start) - 1
            while i < len(texts) and starts[i] < end:  # clamp (split) to each text it covers
                lo = max(start, starts[i]) - starts[i]
                hi = min(end, starts[i] + len(texts[i])) - starts[i]
                if hi > lo:
                    k = (kind, lo, hi)
                    per_text[i][k] = max(per_text[i].get(k, 0.0), score)
                i += 1
        for text, raw in zip(texts, per_text, strict=True):
            self._store_plain(text, self._finish(text, raw, call.policy), call)
