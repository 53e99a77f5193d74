"""What an audit answers: per-thread and per-tenant inventories, the report and the summary
of a streamed audit, age buckets (the audit trail's entries are :mod:`.trail`'s
``TrailEntry``, re-exported here).

Data types and formatting only; how they are computed is :mod:`.inventory` (the row walk) and
:mod:`.sql` (the grouped statement).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from ..textsafety import json_str as _json_str  # json.dumps of a str, DEL escaped too
from ..timeargs import iso  # (used here; importable from here as before)

DAY = 86400.0
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("< 1 day", DAY),
    ("1-7 days", 7 * DAY),
    ("7-30 days", 30 * DAY),
    ("30-90 days", 90 * DAY),
    ("90-365 days", 365 * DAY),
    ("> 1 year", math.inf),
)
UNKNOWN_AGE = "unknown"


def age_bucket(age: float | None) -> str:
    if age is None:
        return UNKNOWN_AGE
    for label, upper in AGE_BUCKETS:
        if age < upper:
            return label
    return AGE_BUCKETS[-1][0]


def registry_number(value: Any) -> float | None:
    """A registry time or duration as the audit reports it: a float, or None when the stored
    value is no number (SQLite keeps text or a blob in a REAL column as given: only a database
    edit puts one there, and comparing it with a time raised TypeError in every audit)."""
    if value is None or type(value) is float:     # what PostgreSQL returns (the hot path)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _checkpoint_epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


@dataclass
class ThreadAudit:
    tenant: str
    thread_id: str
    created_at: float | None
    last_activity: float | None
    expires_at: float | None
    legal_hold: bool
    policy_source: str | None
    idle_ttl: float | None
    max_age: float | None
    state: str | None
    checkpoints: int = 0
    stored_bytes: int = 0
    key_versions: list[int] = field(default_factory=list)
    pii: dict[str, int] = field(default_factory=dict)
    first_checkpoint: float | None = None
    last_checkpoint: float | None = None
    registered: bool = True
    overdue: bool = False          # past expiry, not held: retention is not being executed
    held_past_ttl: bool = False    # would have expired, kept by a legal hold

    def as_dict(self) -> dict[str, Any]:
        # (by hand rather than dataclasses.asdict: the streamed audit calls this per thread)
        out = {f.name: getattr(self, f.name) for f in _THREAD_FIELDS}
        out["key_versions"] = list(self.key_versions)
        out["pii"] = dict(self.pii)
        for key in ("created_at", "last_activity", "expires_at", "first_checkpoint",
                    "last_checkpoint"):
            out[key] = iso(out[key])
        return out


_THREAD_FIELDS = fields(ThreadAudit)


def _json_value(value: Any) -> str:
    """``json.dumps(value, default=str)`` for one field, without its per-call set-up on the
    common types (the streamed audit writes 19 of them per thread)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is str:
        return _json_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value, default=str)


_DATES: dict[int, str] = {}    # day number -> '"YYYY-MM-DDT' (a report spans few days)
_CLOCK: dict[int, str] = {}    # second of the day -> 'HH:MM:SS+00:00"'


def _json_iso(ts: float | None) -> str:
    """``json.dumps(iso(ts))``: the text is digits, ``-``, ``:``, ``T`` and ``+``. Made of
    a day's and a second's text, each formatted once (strftime per value took 0.6 us, a
    tenth of a streamed audit's Python time)."""
    if ts is None:
        return "null"
    try:
        second = math.floor(ts)                  # gmtime's floor, as iso()
        day, second = divmod(second, 86400)
        date, clock = _DATES.get(day), _CLOCK.get(second)
        if date is None:
            date = time.strftime('"%Y-%m-%dT', time.gmtime(day * 86400))
            if len(_DATES) < 100_000:
                _DATES[day] = date
        if clock is None:
            clock = _CLOCK[second] = time.strftime('%H:%M:%S+00:00"', time.gmtime(second))
        return date + clock
    except (OverflowError, OSError, ValueError, TypeError):
        return _json_value(iso(ts))


_BOOLS = ("false", "true")


def _json_text(value: Any) -> str:
    """``_json_value`` for a field that is almost always a str (or None)."""
    if type(value) is str:
        return _json_str(value)
    return _json_value(value)


def thread_json(th: ThreadAudit) -> str:
    """One thread as the JSON text of ``json.dumps(th.as_dict(), default=str)`` (same keys,
    order, separators and escaping), built directly: the streamed audit writes 100k of these
    for 100k threads, so the usual types take a short path."""
    versions = th.key_versions
    if type(versions) is list and len(versions) == 1 and type(versions[0]) is int:
        versions_text = f"[{versions[0]!r}]"
    elif all(type(v) is int for v in versions):
        versions_text = "[" + ", ".join(map(int.__repr__, versions)) + "]"
    else:
        versions_text = json.dumps(list(versions), default=str)
    pii = th.pii
    if not pii:
        pii_text = "{}" if type(pii) is dict else json.dumps(dict(pii), default=str)
    elif all(type(k) is str and type(n) is int for k, n in pii.items()):
        pii_text = "{" + ", ".join(f"{_json_str(k)}: {n!r}" for k, n in pii.items()) + "}"
    else:
        pii_text = json.dumps(dict(pii), default=str)
    v, q, t = _json_value, _json_iso, _json_text
    hold, registered, overdue = th.legal_hold, th.registered, th.overdue
    held_past = th.held_past_ttl
    # the flags a streamed audit always fills with bools, written without dispatch
    if (type(hold) is bool and type(registered) is bool and type(overdue) is bool
            and type(held_past) is bool):
        flags = (f"{_BOOLS[registered]}, \"overdue\": {_BOOLS[overdue]}, "
                 f"\"held_past_ttl\": {_BOOLS[held_past]}}}")
        hold_text = _BOOLS[hold]
    else:
        flags = (f"{v(registered)}, \"overdue\": {v(overdue)}, "
                 f"\"held_past_ttl\": {v(held_past)}}}")
        hold_text = v(hold)
    checkpoints, stored = th.checkpoints, th.stored_bytes
    counts = (f"{checkpoints!r}, \"stored_bytes\": {stored!r}"
              if type(checkpoints) is int and type(stored) is int
              else f"{v(checkpoints)}, \"stored_bytes\": {v(stored)}")
    return (f'{{"tenant": {t(th.tenant)}, "thread_id": {t(th.thread_id)}, '
            f'"created_at": {q(th.created_at)}, "last_activity": {q(th.last_activity)}, '
            f'"expires_at": {q(th.expires_at)}, "legal_hold": {hold_text}, '
            f'"policy_source": {t(th.policy_source)}, "idle_ttl": {v(th.idle_ttl)}, '
            f'"max_age": {v(th.max_age)}, "state": {t(th.state)}, '
            f'"checkpoints": {counts}, '
            f'"key_versions": {versions_text}, "pii": {pii_text}, '
            f'"first_checkpoint": {q(th.first_checkpoint)}, '
            f'"last_checkpoint": {q(th.last_checkpoint)}, '
            f'"registered": {flags}')


@dataclass
class TenantAudit:
    tenant: str
    threads: int = 0
    checkpoints: int = 0
    stored_bytes: int = 0
    key_versions: list[int] = field(default_factory=list)   # named by stored ciphertexts
    current_data_key: int | None = None
    data_keys: list[int] = field(default_factory=list)
    master_versions: list[str] = field(default_factory=list)
    pii: dict[str, int] = field(default_factory=dict)        # distinct values in the vault
    first_created: float | None = None
    overdue: int = 0
    held: int = 0
    unregistered: int = 0
    policy: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["first_created"] = iso(out["first_created"])
        return out


@dataclass
class AuditReport:
    generated_at: float
    backend: str
    tenant_filter: str | None
    tenants: list[TenantAudit]
    threads: list[ThreadAudit]
    orphans: list[dict[str, Any]]               # stored threads whose tag names no tenant
    age_bytes: dict[str, dict[str, int]]        # tenant -> age bucket -> stored bytes
    problems: list[str] = field(default_factory=list)
    store: dict[str, Any] | None = None         # SecureStore items (store_audit), if any

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def overdue(self) -> list[ThreadAudit]:
        return [t for t in self.threads if t.overdue]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "generated_at": iso(self.generated_at), "backend": self.backend,
            "tenant": self.tenant_filter, "problems": self.problems,
            "tenants": [t.as_dict() for t in self.tenants],
            "threads": [t.as_dict() for t in self.threads],
            "orphans": self.orphans,
            "stored_bytes_by_age": self.age_bytes,
            "age_buckets": [label for label, _ in AGE_BUCKETS] + [UNKNOWN_AGE],
            **({"store": self.store} if self.store is not None else {}),
        }


@dataclass
class AuditSummary:
    """What a streamed audit knows at its end (the thread rows went to the output)."""

    generated_at: float
    backend: str
    tenant_filter: str | None
    tenants: list[TenantAudit]
    orphans: list[dict[str, Any]]
    age_bytes: dict[str, dict[str, int]]
    problems: list[str]
    threads: int
    overdue: int
    orphan_count: int = 0
    store: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems
