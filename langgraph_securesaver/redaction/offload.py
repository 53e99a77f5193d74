"""Detection inside the budget of the write, in a worker process once the write is large.

:class:`BudgetedDetection` sits between :class:`~.detection.Detection` and the redactor: every
string (or batch of strings) that needs analysis is first charged to the write's
:class:`~.budget.Spend` (which refuses the write past its budget), then analyzed within the
string's own time budget, in this process for a small write and in a :mod:`.pool` worker
once the write has analyzed ``offload_after`` characters. An analysis that runs past its
time budget or its detection cap refuses the write: nothing is ever withheld in silence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .budget import Spend, current_spend
from .detection import Detection, Overrun
from .errors import RedactionError
from .policy import RedactionPolicy
from .pool import QUEUE_WAIT, Request, shared_pool
from .tokens import kind_label
from .view import OWN_LABELS

Raw = dict[tuple[str, int, int], float]
OFFLOAD_PARTS = 64  # strings a write analyzes in-process before offloading, however short


class BudgetedDetection(Detection):
    """The budget- and pool-aware half of detection (see the module docstring)."""

    policy: RedactionPolicy
    _custom_analyzer: bool
    _phone_regions: tuple[str, ...]
    _clock: Callable[[], float]

    def new_spend(self) -> Spend:
        """The spend of the write in progress, or one of its own for a lone redaction."""
        spend = current_spend() or Spend()
        spend.bind(self.policy.write_budget)
        return spend

    def detect_raw(self, text: str, policy: RedactionPolicy,
                   seconds: float) -> tuple[Raw | None, str | None]:
        """Raw detections of ``text`` within ``seconds`` (what a worker runs), or None and
        why the analysis stopped."""
        self._ensure_engine()
        try:
            return self._raw_detect(text, policy, self._clock() + seconds), None
        except Overrun as exc:
            return None, str(exc)

    def _worker_params(self, policy: RedactionPolicy) -> dict[str, Any]:
        kinds = set(self.policy.actions)
        for sub in self.policy.channels.values():
            if sub is not None:
                kinds |= set(sub.actions)
        kinds |= set(policy.actions) | OWN_LABELS
        return {"kinds": sorted(kind_label(k) for k in kinds), "regions": self._phone_regions,
                "score_threshold": policy.score_threshold, "max_chars": policy.max_chars,
                "hard_max_chars": policy.hard_max_chars, "time_budget": policy.time_budget,
                "max_detections": policy.max_detections}

    def _budgeted_detect(self, text: str, policy: RedactionPolicy, spend: Spend,
                         free: bool = False) -> Raw:
        """Raw detections of ``text``; raises RedactionError past the write's budget or the
        string's own limits.

        ``free``: ``text`` is (part of) a string the tenant read back from storage (see
        :mod:`.readback`), paid for when it was stored: it is not charged to the write."""
        begun = self._begin_detect(text, policy, spend, free, (text,))
        return self._end_detect(begun) if isinstance(begun, InFlight) else begun

    def _begin_detect(self, text: str, policy: RedactionPolicy, spend: Spend,
                      free: bool, parts: Sequence[str]) -> Raw | InFlight:
        """:meth:`_budgeted_detect` of ``text`` (``parts`` joined) up to the point where a
        worker took it: then the caller may do other work before :meth:`_end_detect`
        collects the answer (which it must, or :meth:`_abandon_detect`). In-process analysis
        finishes here."""
        if not free:
            spend.admit(parts)
        self._ensure_engine()
        units = max(1, -(-len(text) // policy.max_chars))
        limit = policy.time_budget * units
        pool = shared_pool()
        offload = free or spend.chars > pool.offload_after or spend.parts > OFFLOAD_PARTS
        if (pool.enabled and not self._custom_analyzer and offload
                and len(text) <= policy.hard_max_chars):
            # a large write waits for a worker rather than analyze beside other tenants'
            # turns under the serving process's GIL
            request = pool.send(text, self._worker_params(policy), limit, QUEUE_WAIT)
            if request is not None:
                return InFlight(request, len(text))
        try:
            return self._raw_detect(text, policy, self._clock() + limit)
        except Overrun as exc:
            raise _refusal(len(text), str(exc), policy) from None

    def _end_detect(self, flight: InFlight) -> Raw:
        """The answer to an analysis :meth:`_begin_detect` handed to a worker."""
        raw, why, _took = shared_pool().answer(flight.request)
        if raw is None:
            raise _refusal(flight.chars, why or "time budget", self.policy)
        return raw

    @staticmethod
    def _abandon_detect(flight: InFlight) -> None:
        """Drop an analysis handed to a worker whose write failed meanwhile."""
        shared_pool().abandon(flight.request)


@dataclass(frozen=True, slots=True)
class InFlight:
    """An analysis a worker took and has not answered yet."""

    request: Request
    chars: int


def _refusal(chars: int, why: str, policy: RedactionPolicy) -> RedactionError:
    return RedactionError(
        f"redaction of a {chars}-character string ran past its {why} "
        f"({policy.time_budget} s per {policy.max_chars} characters, at most "
        f"{policy.max_detections} detections); nothing of the write was stored")
