"""Detection inside the budget of the write, in a worker process once the write is large.

:class:`BudgetedDetection` sits between :class:`~.detection.Detection` and the redactor: every
string (or batch of JSON strings) that needs analysis is first admitted by the write's
:class:`~.budget.Spend`, then analyzed with a deadline that is the earlier of the string's
own time budget and what the write has left (CPU, and wall-clock once the write's deadline
applies), in this process for a small write and in a :mod:`.pool` worker once the write has
analyzed ``offload_after`` characters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .budget import Spend, current_spend
from .detection import Detection, Overrun
from .policy import RedactionPolicy
from .pool import Request, shared_pool
from .tokens import kind_label
from .view import OWN_LABELS

Raw = dict[tuple[str, int, int], float]
YIELD_AFTER = 64  # analyses (or strings) in one write before it starts yielding
YIELD_EVERY = 0.0005  # then it hands the GIL over at most this often (wall seconds)
WALL_SLACK = 4.0
OFFLOAD_PARTS = 64  # strings a write analyzes in-process before offloading, however short


class BudgetedDetection(Detection):
    """The budget- and pool-aware half of detection (see the module docstring)."""

    policy: RedactionPolicy
    _custom_analyzer: bool
    _phone_regions: tuple[str, ...]
    _clock: Callable[[], float]
    #: the CPU clock the write budget is charged with (this thread's CPU time)
    _cpu_clock: Callable[[], float] = staticmethod(time.thread_time)
    _yielded: float = 0.0  # when a write last handed the GIL over (any thread; a hint only)

    def new_spend(self) -> Spend:
        """The spend of the write in progress, or one of its own for a lone redaction."""
        spend = current_spend() or Spend()
        spend.bind(self.policy.write_budget)
        return spend

    def _share_the_gil(self, spend: Spend) -> None:
        """A large write (or one past its budget) hands the GIL to other requests now and
        then: at most every YIELD_EVERY seconds, not per string (a sleep costs ~60 us of
        timer slack, more than withholding a string does)."""
        if (spend.calls > YIELD_AFTER or spend.parts > YIELD_AFTER
                or spend.exceeded is not None):
            now = self._clock()
            if now - self._yielded > YIELD_EVERY:
                time.sleep(0)
                self._yielded = self._clock()

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
                         free: bool = False, parts: int = 1) -> Raw | str:
        """Raw detections of ``text``, or why it must be withheld. Raises RedactionError when
        the write's budget is spent and its policy refuses rather than withholds.

        ``free``: ``text`` is (part of) a string the tenant read back from storage (see
        :mod:`.readback`), paid for when it was stored: it is analyzed within its own time
        budget, whatever the write has spent, and is not charged to the write."""
        begun = self._begin_detect(text, policy, spend, free, parts)
        return self._end_detect(begun) if isinstance(begun, InFlight) else begun

    def _begin_detect(self, text: str, policy: RedactionPolicy, spend: Spend,
                      free: bool = False, parts: int = 1) -> Raw | str | InFlight:
        """:meth:`_budgeted_detect` up to the point where a worker took the text: then the
        caller may do other work before :meth:`_end_detect` collects the answer (which it
        must, or :meth:`_abandon_detect`). In-process analysis finishes here."""
        spend.calls += 1
        self._share_the_gil(spend)
        spent = spend.exceeded
        if (not free and spent is not None and spend.budget is not None
                and spend.budget.on_exceed == "mask"):
            spend.withheld += 1  # the fast path of a write past its budget (a hostile one)
            return spent
        reason = None if free else spend.admit(len(text), parts)
        if reason is not None:
            return reason
        self._ensure_engine()  # building the engine is not analysis time of this write
        units = max(1, -(-len(text) // policy.max_chars))
        own = policy.time_budget * units
        left = own / WALL_SLACK if free else spend.remaining()
        # the budget counts CPU seconds (a loaded machine does not make a turn "bigger"); one
        # string may take up to WALL_SLACK times what is left in wall-clock time, and no more
        # than the write's wall-clock deadline leaves once that applies
        limit = max(0.0, min(own, left * WALL_SLACK))
        wall_left = None if free else spend.wall_left()
        by_wall = wall_left is not None and wall_left < limit
        if by_wall:
            limit = max(0.0, wall_left or 0.0)
        # past this string's own deadline, is it the write's deadline that ran out?
        the_writes = not free and (by_wall or left * WALL_SLACK < own)
        pool = shared_pool()
        clock, cpu = self._clock, self._cpu_clock
        offload = free or spend.chars > pool.offload_after or spend.parts > OFFLOAD_PARTS
        started = clock()
        if (pool.enabled and not self._custom_analyzer and offload
                and len(text) <= policy.hard_max_chars):
            request = pool.send(text, self._worker_params(policy), limit)
            if request is not None:
                return InFlight(request, spend, started, free, by_wall, the_writes)
        used = cpu()
        try:
            raw, why = self._raw_detect(text, policy, started + limit), None
        except Overrun as exc:
            raw, why = None, str(exc)
        finally:
            if not free:
                spend.charge(cpu() - used, clock() - started)
        return _outcome(raw, why, spend, by_wall, the_writes)

    def _end_detect(self, flight: InFlight) -> Raw | str:
        """The answer to an analysis :meth:`_begin_detect` handed to a worker."""
        raw, why, took = shared_pool().answer(flight.request)
        if not flight.free:
            # the wall time includes what the caller did meanwhile: it can only make the
            # write's wall-clock bound stricter
            flight.spend.charge(took, self._clock() - flight.started)
        return _outcome(raw, why, flight.spend, flight.by_wall, flight.the_writes)

    @staticmethod
    def _abandon_detect(flight: InFlight) -> None:
        """Drop an analysis handed to a worker whose write failed meanwhile."""
        shared_pool().abandon(flight.request)


@dataclass(frozen=True, slots=True)
class InFlight:
    """An analysis a worker took and has not answered yet (see
    :meth:`BudgetedDetection._begin_detect`)."""

    request: Request
    spend: Spend
    started: float
    free: bool
    by_wall: bool
    the_writes: bool


def _outcome(raw: Raw | None, why: str | None, spend: Spend, by_wall: bool,
             the_writes: bool) -> Raw | str:
    """Raw detections, or why the text is withheld: its own time budget, or the write's
    deadline (which ``spend`` then records; with ``on_exceed="raise"`` it raises)."""
    if raw is not None:
        return raw
    reason = why or "time budget"
    if reason == "time budget" and the_writes:
        return spend.overran(wall=by_wall)  # the write's deadline, not the string's own
    return reason
