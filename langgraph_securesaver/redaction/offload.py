"""Detection inside the budget of the write, in a worker process once the write is large.

:class:`BudgetedDetection` sits between :class:`~.detection.Detection` and the redactor: every
string (or batch of JSON strings) that needs analysis is first admitted by the write's
:class:`~.budget.Spend`, then analyzed with a deadline that is the earlier of the string's
own time budget and what the write has left, in this process for a small write and in a
:mod:`.pool` worker once the write has analyzed ``offload_after`` characters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .budget import Spend, current_spend
from .detection import Detection, Overrun
from .policy import RedactionPolicy
from .pool import shared_pool
from .tokens import kind_label
from .view import OWN_LABELS

Raw = dict[tuple[str, int, int], float]
YIELD_AFTER = 64  # strings analyzed (or withheld) in one write before it starts yielding
YIELD_EVERY = 8
WALL_SLACK = 4.0


class BudgetedDetection(Detection):
    """The budget- and pool-aware half of detection (see the module docstring)."""

    policy: RedactionPolicy
    _custom_analyzer: bool
    _phone_regions: tuple[str, ...]
    _clock: Callable[[], float]
    #: the CPU clock the write budget is charged with (this thread's CPU time)
    _cpu_clock: Callable[[], float] = staticmethod(time.thread_time)

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

    def _budgeted_detect(self, text: str, policy: RedactionPolicy,
                         spend: Spend) -> Raw | str:
        """Raw detections of ``text``, or why it must be withheld. Raises RedactionError when
        the write's budget is spent and its policy refuses rather than withholds."""
        spend.calls += 1
        if spend.calls > YIELD_AFTER and not spend.calls % YIELD_EVERY:
            time.sleep(0)  # a large write hands the GIL to other requests between strings
        spent = spend.exceeded
        if spent is not None and spend.budget is not None and spend.budget.on_exceed == "mask":
            spend.withheld += 1  # the fast path of a write past its budget (a hostile one)
            return spent
        reason = spend.admit(len(text))
        if reason is not None:
            return reason
        self._ensure_engine()  # building the engine is not analysis time of this write
        units = max(1, -(-len(text) // policy.max_chars))
        own = policy.time_budget * units
        left = spend.remaining()
        # the budget counts CPU seconds (a loaded machine does not make a turn "bigger"); one
        # string may take up to WALL_SLACK times what is left in wall-clock time
        limit = max(0.0, min(own, left * WALL_SLACK))
        pool = shared_pool()
        clock, cpu = self._clock, self._cpu_clock
        answer = None
        if (pool.enabled and not self._custom_analyzer and spend.chars > pool.offload_after
                and len(text) <= policy.hard_max_chars):
            answer = pool.detect(text, self._worker_params(policy), limit)
        if answer is not None:
            raw, why, took = answer
            spend.charge(took)
        else:
            started, used = clock(), cpu()
            try:
                raw, why = self._raw_detect(text, policy, started + limit), None
            except Overrun as exc:
                raw, why = None, str(exc)
            finally:
                spend.charge(cpu() - used)
        if raw is not None:
            return raw
        reason = why or "time budget"
        if reason == "time budget" and left * WALL_SLACK < own:  # the write's deadline bound
            return spend.overran()
        return reason
