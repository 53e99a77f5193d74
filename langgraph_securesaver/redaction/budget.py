"""The redaction budget of one write: how much analysis a single put / put_writes may cause.

Every per-string limit of the policy can hold while one write still carries hundreds of
strings, each just under them; without a bound per write, one caller's message keeps a
process busy for seconds to minutes. :class:`WriteBudget` bounds the characters analyzed,
the strings analyzed and the analysis time of one write (CPU seconds, and wall-clock seconds
once the write has used more CPU than any real turn needs). Past it, each string still to be
analyzed is withheld (``<WITHHELD:masked>``, never stored in clear) or the whole write is
refused with :class:`RedactionError`, per ``on_exceed``.

Only work counts: strings answered from the redactor's caches and strings the pre-filter
shows cannot hold anything detectable cost nothing, so a long conversation pays for its new
turn only. Message content the tenant read back (:mod:`.readback`) is analyzed again after a
restart but never charged: what a thread already stored is never withheld by the budget.

:func:`write_scope` makes the redactions of one write share one :class:`Spend` (the saver
opens it around a put's channels and metadata); a redaction outside any scope is a write of
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigurationError
from .errors import RedactionError

# Defaults: see docs/redaction.md ("The budget of one write") for the turns they were
# measured against.
# The character and string bounds stop the hostile writes of docs/benchmarks.md whatever the
# machine's speed or load; the time bounds, far above any real turn, only catch text that
# costs much more per character than prose does.
DEFAULT_WRITE_CHARS = 600_000
DEFAULT_WRITE_PARTS = 5_000
DEFAULT_WRITE_SECONDS = 1.0
DEFAULT_WRITE_WALL = 2.0
DEFAULT_WALL_AFTER = 0.6
DEFAULT_COOL_DOWN = 10.0
DEFAULT_PENALTY = 0.1
DEFAULT_SPACING = 1.0
ON_EXCEED = ("mask", "raise")


@dataclass(frozen=True)
class WriteBudget:
    """Bounds on the redaction work of one write.

    Attributes:
        max_chars: characters analyzed per write (cache hits and pre-filtered text are free).
        max_parts: strings analyzed per write.
        time_budget: CPU seconds of analysis per write (measured where it ran: this
            thread, or the redaction worker), so that a loaded machine does not make a real
            turn look bigger; one string may take up to four times what is left in wall time.
        wall_budget: wall-clock seconds (monotonic) of analysis per write -- the time its
            strings spent being analyzed, here or waiting on a worker -- enforced once the
            write has used ``wall_after`` CPU seconds of analysis: on a loaded machine one
            CPU second stretches to many wall seconds, while other requests wait for the
            worker and the GIL. Real turns (a quarter of a CPU second or less, see
            docs/redaction.md) stay well below ``wall_after``, so load alone never withholds
            them.
        wall_after: CPU seconds of analysis a write may use before ``wall_budget`` applies.
        on_exceed: ``"mask"`` withholds each string past the budget as
            ``<WITHHELD:masked>``; ``"raise"`` refuses the write with ``RedactionError``.
        cool_down: seconds after a write of a tenant ran past its budget, having done at
            least half of one bound's work (:meth:`Spend.worked`), during which that
            tenant's writes (in this process) get ``penalty`` times the budget: a chat turn
            still fits, the next hostile write is refused after a tenth of the analysis
            instead of costing the process another budget's worth of analysis and storage.
            0 turns it off.
        penalty: the fraction of every bound a tenant in its cool-down gets; a write of it
            that exceeds this smaller budget is refused with ``RedactionError`` whatever
            ``on_exceed`` says: it is the same tenant's next over-budget write, and storing
            megabytes of withheld markers would cost the process (serializing, sealing,
            storing) what the budget saved.
        spacing: seconds between the starts of two writes of a tenant in its cool-down (in
            this process): a write waits for its turn (async: without holding a thread), and
            one that would wait more than ``spacing`` is refused with ``RedactionError``.
            A tenant sending over-budget writes back to back then gets one write a second,
            not a share of the process. 0 turns the pacing off.
    """

    max_chars: int = DEFAULT_WRITE_CHARS
    max_parts: int = DEFAULT_WRITE_PARTS
    time_budget: float = DEFAULT_WRITE_SECONDS
    on_exceed: str = "mask"
    wall_budget: float = DEFAULT_WRITE_WALL
    wall_after: float = DEFAULT_WALL_AFTER
    cool_down: float = DEFAULT_COOL_DOWN
    penalty: float = DEFAULT_PENALTY
    spacing: float = DEFAULT_SPACING

    def __post_init__(self) -> None:
        if int(self.max_chars) < 1_000:
            raise ConfigurationError("write budget max_chars must be at least 1000")
        if int(self.max_parts) < 1:
            raise ConfigurationError("write budget max_parts must be at least 1")
        if not 0.0 < float(self.time_budget) <= 3600.0:
            raise ConfigurationError("write budget time_budget must be > 0 and <= 3600 s")
        if not 0.0 < float(self.wall_budget) <= 3600.0:
            raise ConfigurationError("write budget wall_budget must be > 0 and <= 3600 s")
        if not 0.0 <= float(self.wall_after) <= 3600.0:
            raise ConfigurationError("write budget wall_after must be >= 0 and <= 3600 s")
        if not 0.0 <= float(self.cool_down) <= 86400.0:
            raise ConfigurationError("write budget cool_down must be >= 0 and <= 86400 s")
        if not 0.0 < float(self.penalty) <= 1.0:
            raise ConfigurationError("write budget penalty must be > 0 and <= 1")
        if not 0.0 <= float(self.spacing) <= 3600.0:
            raise ConfigurationError("write budget spacing must be >= 0 and <= 3600 s")
        if self.on_exceed not in ON_EXCEED:
            raise ConfigurationError(f"write budget on_exceed must be one of {ON_EXCEED}")
        object.__setattr__(self, "max_chars", int(self.max_chars))
        object.__setattr__(self, "max_parts", int(self.max_parts))
        object.__setattr__(self, "time_budget", float(self.time_budget))
        object.__setattr__(self, "wall_budget", float(self.wall_budget))
        object.__setattr__(self, "wall_after", float(self.wall_after))
        object.__setattr__(self, "cool_down", float(self.cool_down))
        object.__setattr__(self, "penalty", float(self.penalty))
        object.__setattr__(self, "spacing", float(self.spacing))

    def scaled(self, factor: float) -> WriteBudget:
        """This budget with every bound times ``factor``, refusing what exceeds it (a tenant in
        its cool-down: see :class:`Spend`)."""
        if factor >= 1.0:
            return self
        return dataclasses.replace(
            self, on_exceed="raise", max_chars=max(1_000, int(self.max_chars * factor)),
            max_parts=max(1, int(self.max_parts * factor)),
            time_budget=self.time_budget * factor, wall_budget=self.wall_budget * factor,
            wall_after=self.wall_after * factor)

    @classmethod
    def unlimited(cls) -> WriteBudget:
        """No practical bound (an hour of analysis per write): for trusted batch jobs."""
        return cls(max_chars=2**62, max_parts=2**62, time_budget=3600.0, wall_budget=3600.0,
                   wall_after=3600.0, cool_down=0.0)


class Spend:
    """What one write has spent so far; shared by every redaction of the write (and by the
    threads that may run them), so it is locked."""

    __slots__ = ("budget", "calls", "chars", "cooling", "exceeded", "lock", "parts",
                 "pii_epochs", "seconds", "tenant", "wall", "withheld")

    def __init__(self, budget: WriteBudget | None = None, tenant: str | None = None) -> None:
        self.budget = budget
        self.tenant = tenant  # whose write this is (for the cool-down), if the saver said
        self.pii_epochs: set[str] = set()   # tenants whose vault epoch this write checked
        self.chars = 0
        self.parts = 0
        self.seconds = 0.0
        self.withheld = 0
        self.calls = 0  # strings (or batches) that needed analysis, admitted or not
        self.exceeded: str | None = None  # why the budget is spent, once it is
        self.lock = threading.Lock()
        self.wall = 0.0  # wall-clock seconds of the analyses charged so far
        self.cooling = False  # the tenant was in its cool-down when the write started

    def bind(self, budget: WriteBudget) -> WriteBudget:
        """The budget of the write: the first redaction's policy sets it."""
        with self.lock:
            if self.budget is None:
                if self.tenant is not None and budget.cool_down > 0:
                    factor = COOL_DOWNS.factor(self.tenant, budget.penalty)
                    self.cooling = factor < 1.0
                    budget = budget.scaled(factor)
                self.budget = budget
            return self.budget

    def wall_left(self) -> float | None:
        """Wall seconds of analysis the write has left, or None while its wall-clock bound
        does not apply yet (less than ``wall_after`` CPU seconds used)."""
        budget = self.budget
        if budget is None:  # pragma: no cover
            return None
        with self.lock:
            if self.seconds < budget.wall_after:
                return None
            return budget.wall_budget - self.wall

    def admit(self, chars: int, parts: int = 1) -> str | None:
        """None if a string of ``chars`` characters (a batch of ``parts`` strings) may be
        analyzed, else why not (and with ``on_exceed="raise"`` the refusal is raised
        instead)."""
        budget = self.budget
        if budget is None:  # pragma: no cover - the redactor binds before admitting
            return None
        with self.lock:
            if self.exceeded is None:
                if self.parts + parts > budget.max_parts:
                    self.exceeded = f"write budget: more than {budget.max_parts} strings"
                elif self.chars + chars > budget.max_chars:
                    self.exceeded = f"write budget: more than {budget.max_chars} characters"
                elif self.seconds >= budget.time_budget:
                    self.exceeded = f"write budget: {budget.time_budget} s of analysis"
                elif (self.seconds >= budget.wall_after
                      and self.wall >= budget.wall_budget):
                    self.exceeded = f"write budget: {budget.wall_budget} s of wall time"
            reason = self.exceeded
            if reason is None:
                self.parts += parts
                self.chars += chars
            else:
                self.withheld += 1
        if reason is not None and budget.on_exceed == "raise":
            raise self.refusal(reason)
        return reason

    def refusal(self, reason: str) -> RedactionError:
        """The error of a write refused for its budget (``reason`` names the bound)."""
        if self.cooling:
            return RedactionError(
                f"the write was refused and not stored: it needs more redaction ({reason}) "
                "than a tenant gets during the cool-down that follows one of its writes "
                "running past its budget; retry later, or raise "
                "RedactionPolicy(write_budget=WriteBudget(...)) if such writes are expected")
        return RedactionError(
            f"the write needs more redaction than its budget allows ({reason}); it was not "
            "stored. Raise RedactionPolicy(write_budget=WriteBudget(...)) if such writes are "
            "expected")

    def worked(self) -> bool:
        """Whether the write did at least half of one bound's work: what a write must have
        cost the process before running past its budget starts its tenant's cool-down. A
        string refused for its length alone, before any analysis, costs nothing."""
        budget = self.budget
        if budget is None:  # pragma: no cover
            return False
        with self.lock:
            return (2 * self.chars >= budget.max_chars or 2 * self.parts >= budget.max_parts
                    or 2 * self.seconds >= budget.time_budget)

    def parts_left(self) -> int:
        """Strings the write may still have analyzed."""
        budget = self.budget
        if budget is None:  # pragma: no cover
            return 1 << 62
        with self.lock:
            return budget.max_parts - self.parts

    def remaining(self) -> float:
        """Seconds of analysis the write has left."""
        budget = self.budget
        if budget is None:  # pragma: no cover
            return 3600.0
        with self.lock:
            return budget.time_budget - self.seconds

    def charge(self, seconds: float, wall: float = 0.0) -> None:
        """Add one analysis: its CPU ``seconds`` and its ``wall``-clock seconds."""
        with self.lock:
            self.seconds += max(0.0, seconds)
            self.wall += max(0.0, wall)

    def overran(self, wall: bool = False) -> str:
        """Record that an analysis ran into the write's deadline (``wall``: its wall-clock
        one); returns the reason."""
        budget = self.budget
        with self.lock:
            if self.exceeded is None:
                if wall:
                    limit = budget.wall_budget if budget is not None else 0.0
                    self.exceeded = f"write budget: {limit} s of wall time"
                else:
                    limit = budget.time_budget if budget is not None else 0.0
                    self.exceeded = f"write budget: {limit} s of analysis"
            self.withheld += 1
            reason = self.exceeded
        if budget is not None and budget.on_exceed == "raise":
            raise self.refusal(reason)
        return reason


_CURRENT: contextvars.ContextVar[Spend | None] = contextvars.ContextVar(
    "securesaver_write_spend", default=None)


def current_spend() -> Spend | None:
    """The spend of the write in progress on this thread (None outside :func:`write_scope`)."""
    return _CURRENT.get()


class CoolDowns:
    """Which tenants ran a write past its budget lately (this process; thread-safe).

    The budget bounds one write; a tenant sending over-budget writes back to back would still
    keep a worker and the database busy with one budget's worth of each. A write that ran
    past its budget starts its tenant's cool-down: until it ends, the tenant's writes get
    ``penalty`` times every bound (see :class:`WriteBudget`)."""

    MAX_TENANTS = 10_000

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._next: dict[str, float] = {}  # when the tenant's next write may start
        self._lock = threading.Lock()

    def factor(self, tenant: str, penalty: float) -> float:
        until = self._until.get(tenant)
        return penalty if until is not None and time.monotonic() < until else 1.0

    def start(self, tenant: str, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._until) >= self.MAX_TENANTS:  # drop the ended ones, then the oldest
                live = sorted((u, t) for t, u in self._until.items() if u > now)
                self._until = {t: u for u, t in live[-(self.MAX_TENANTS // 2):]}
                self._next = {t: u for t, u in self._next.items() if t in self._until}
            self._until[tenant] = now + seconds

    def turn(self, tenant: str, budget: WriteBudget) -> float:
        """Seconds the tenant's write must wait before it starts (0.0 outside a cool-down);
        raises ``RedactionError`` when that is more than ``budget.spacing``."""
        if budget.spacing <= 0 or budget.cool_down <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            until = self._until.get(tenant)
            if until is None or now >= until:
                return 0.0
            start = max(now, self._next.get(tenant, 0.0))
            if start - now > budget.spacing:
                refused = True
            else:
                refused = False
                self._next[tenant] = start + budget.spacing
        if refused:
            raise RedactionError(
                "the write was refused and not stored: a recent write of this tenant ran past "
                f"its redaction budget, and until its cool-down ends ({budget.cool_down} s) "
                f"the tenant's writes start at most once per {budget.spacing} s; retry later")
        return start - now

    def wait_turn(self, tenant: str, budget: WriteBudget) -> None:
        """:meth:`turn`, waited for in this thread."""
        delay = self.turn(tenant, budget)
        if delay > 0:
            time.sleep(delay)

    async def await_turn(self, tenant: str, budget: WriteBudget) -> None:
        """:meth:`turn`, awaited (no thread is held while the write waits)."""
        delay = self.turn(tenant, budget)
        if delay > 0:
            await asyncio.sleep(delay)

    def clear(self) -> None:
        with self._lock:
            self._until.clear()
            self._next.clear()


COOL_DOWNS = CoolDowns()


@contextlib.contextmanager
def write_scope(tenant: str | None = None) -> Iterator[Spend]:
    """Make every redaction inside share one budget (one write of ``tenant``). Nested scopes
    join the outer one: a write is never given a fresh budget halfway through. A write that
    ran past its budget (withheld or refused) starts the tenant's cool-down."""
    outer = _CURRENT.get()
    if outer is not None:
        yield outer
        return
    spend = Spend(tenant=tenant)
    token = _CURRENT.set(spend)
    try:
        yield spend
    finally:
        _CURRENT.reset(token)
        budget = spend.budget
        # only a write that did real work starts one: a string over max_chars is refused
        # before any analysis and must not let a caller throttle its whole tenant
        if (tenant is not None and spend.exceeded is not None and budget is not None
                and budget.cool_down > 0 and spend.worked()):
            COOL_DOWNS.start(tenant, budget.cool_down)
