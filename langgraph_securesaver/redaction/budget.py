"""The redaction budget of one write: how many characters and strings it may have analyzed.

The policy's per-string limits can hold while one write carries hundreds of strings, each
just under them. :class:`WriteBudget` bounds the characters and the strings one write
(a put, a put_writes, a store put) has analyzed. Costs are counted deterministically: each
distinct string the write needs analyzed is charged its length once, whatever the machine's
load, whatever other tenants do, however many times its result is looked up again. Strings
answered from the redactor's caches before the write needed them, strings the pre-filter
shows cannot hold anything detectable, and message content the tenant read back
(:mod:`.readback`) cost nothing.

A write past its budget is refused with :class:`RedactionError` before anything of it is
stored: no part of a write is ever withheld or masked for its size. Fairness between tenants
is not the budget's job: :mod:`.scheduler` runs each tenant's work in its own queue.

:func:`write_scope` makes the redactions of one write share one :class:`Spend`; a
redaction outside any scope is a write of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..errors import ConfigurationError
from .errors import RedactionError

# Defaults: a 310 K-character search result fits twice; docs/redaction.md ("The budget of
# one write") lists the turns they were checked against.
DEFAULT_WRITE_CHARS = 600_000
DEFAULT_WRITE_PARTS = 5_000


@dataclass(frozen=True)
class WriteBudget:
    """Bounds on the redaction work of one write.

    Attributes:
        max_chars: characters analyzed per write (each distinct string once).
        max_parts: distinct strings analyzed per write.
    """

    max_chars: int = DEFAULT_WRITE_CHARS
    max_parts: int = DEFAULT_WRITE_PARTS

    def __post_init__(self) -> None:
        if int(self.max_chars) < 1_000:
            raise ConfigurationError("write budget max_chars must be at least 1000")
        if int(self.max_parts) < 1:
            raise ConfigurationError("write budget max_parts must be at least 1")
        object.__setattr__(self, "max_chars", int(self.max_chars))
        object.__setattr__(self, "max_parts", int(self.max_parts))

    @classmethod
    def unlimited(cls) -> WriteBudget:
        """No practical bound: for trusted batch jobs."""
        return cls(max_chars=2**62, max_parts=2**62)


class Spend:
    """What one write has had analyzed so far; shared by every redaction of the write (and
    by the threads that may run them), so it is locked."""

    __slots__ = ("budget", "charged", "chars", "lock", "parts", "pii_epochs")

    def __init__(self, budget: WriteBudget | None = None) -> None:
        self.budget = budget
        self.pii_epochs: set[str] = set()   # tenants whose vault epoch this write checked
        self.chars = 0
        self.parts = 0
        self.charged: set[str] = set()  # the strings charged: each is charged once
        self.lock = threading.Lock()

    def bind(self, budget: WriteBudget) -> WriteBudget:
        """The budget of the write: the first redaction's policy sets it."""
        with self.lock:
            if self.budget is None:
                self.budget = budget
            return self.budget

    def admit(self, texts: Iterable[str]) -> None:
        """Charge the strings of ``texts`` not charged before; raises ``RedactionError``
        (nothing charged) when that takes the write past its budget."""
        budget = self.budget or WriteBudget()
        with self.lock:
            new = {t: None for t in texts if t not in self.charged}
            chars = self.chars + sum(map(len, new))
            parts = self.parts + len(new)
            if parts > budget.max_parts:
                reason = f"more than {budget.max_parts} strings"
            elif chars > budget.max_chars:
                reason = f"more than {budget.max_chars} characters"
            else:
                self.chars, self.parts = chars, parts
                self.charged.update(new)
                return
        raise RedactionError(
            f"the write needs more redaction than its budget allows ({reason} to analyze); "
            "nothing of it was stored. Split it, or raise "
            "RedactionPolicy(write_budget=WriteBudget(...)) if such writes are expected")

    def parts_left(self) -> int:
        """Strings the write may still have analyzed."""
        budget = self.budget or WriteBudget()
        with self.lock:
            return budget.max_parts - self.parts


_CURRENT: contextvars.ContextVar[Spend | None] = contextvars.ContextVar(
    "securesaver_write_spend", default=None)


def current_spend() -> Spend | None:
    """The spend of the write in progress on this thread (None outside :func:`write_scope`)."""
    return _CURRENT.get()


@contextlib.contextmanager
def write_scope() -> Iterator[Spend]:
    """Make every redaction inside share one budget (one write). Nested scopes join the
    outer one: a write is never given a fresh budget halfway through."""
    outer = _CURRENT.get()
    if outer is not None:
        yield outer
        return
    spend = Spend()
    token = _CURRENT.set(spend)
    try:
        yield spend
    finally:
        _CURRENT.reset(token)
