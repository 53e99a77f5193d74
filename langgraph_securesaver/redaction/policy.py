"""What to do with each kind of detected entity, per channel."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from ..errors import ConfigurationError
from .budget import WriteBudget


class Action(str, Enum):
    """What happens to a detected value."""

    TOKENIZE = "tokenize"  # replaced by a stable <KIND:hex> token; original kept for restore
    MASK = "mask"  # replaced by <KIND:masked>; irreversible
    DROP = "drop"  # removed (empty string); irreversible
    KEEP = "keep"  # left as is (still reported by Redactor.redact)


# Kinds tokenized by default: reversible through the saver's encrypted vault.
DEFAULT_TOKENIZED: tuple[str, ...] = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CN_MOBILE",
    "CN_RESIDENT_ID",
    "IBAN_CODE",
    "IP_ADDRESS",
    "US_SSN",
    "CRYPTO",
    "PERSON",
    "LOCATION",
)
# Kinds masked by default: secrets and card numbers are never written anywhere, not even to the
# encrypted vault (a stored card number puts the database in PCI-DSS scope).
DEFAULT_MASKED: tuple[str, ...] = ("API_SECRET", "CREDIT_CARD", "EMBEDDED_PII")

DEFAULT_SCORE_THRESHOLD = 0.4
DEFAULT_MAX_CHARS = 20_000
DEFAULT_HARD_MAX_CHARS = 2_000_000
DEFAULT_MAX_DEPTH = 100
DEFAULT_TIME_BUDGET = 2.0
DEFAULT_MAX_DETECTIONS = 5_000


def _default_actions() -> dict[str, Action]:
    actions = {kind: Action.TOKENIZE for kind in DEFAULT_TOKENIZED}
    actions.update({kind: Action.MASK for kind in DEFAULT_MASKED})
    return actions


@dataclass(frozen=True, eq=False)
class RedactionPolicy:
    """A redaction policy. Immutable and hashable; build variants with ``dataclasses.replace``.

    Attributes:
        actions: action per entity kind (keys are upper-cased).
        default_action: action for a detected kind missing from ``actions``.
        channels: per-channel override; a channel mapped to ``None`` is not redacted at all.
            Override policies apply as they are (their own ``channels`` are ignored).
        allowlist: literal values that are never redacted, compared case-insensitively with
            the detected value (e.g. your support address).
        score_threshold: detections scoring lower are ignored (phone numbers score 0.4,
            validated/checksummed kinds 1.0).
        max_chars: text longer than this is analyzed in chunks of this size that overlap by
            ``SECRET_OVERLAP`` (4096) characters, or half a chunk if smaller; private-key
            blocks are matched over the whole text.
        hard_max_chars: text longer than this is refused with ``RedactionError``.
        max_depth: nesting deeper than this is refused with ``RedactionError``.
        time_budget: seconds of analysis allowed per ``max_chars`` characters of one string
            (at least one unit). A write holding a string whose analysis runs longer is
            refused with ``RedactionError``; nothing of it is stored.
        max_detections: a write holding a single string with more raw detections than this
            (a hostile input: e.g. tens of thousands of key headers) is refused the same way,
            which bounds the work and the garbage one value can cause.
        write_budget: bounds on the analysis of one whole write (see :mod:`.budget`); the
            top-level policy's applies (channel overrides do not change it). Not part of the
            fingerprint: it decides what is refused, never what a string redacts to.
    """

    actions: Mapping[str, Action] = field(default_factory=_default_actions)
    default_action: Action = Action.TOKENIZE
    channels: Mapping[str, RedactionPolicy | None] = field(default_factory=dict)
    allowlist: frozenset[str] = frozenset()
    score_threshold: float = DEFAULT_SCORE_THRESHOLD
    max_chars: int = DEFAULT_MAX_CHARS
    hard_max_chars: int = DEFAULT_HARD_MAX_CHARS
    max_depth: int = DEFAULT_MAX_DEPTH
    time_budget: float = DEFAULT_TIME_BUDGET
    max_detections: int = DEFAULT_MAX_DETECTIONS
    write_budget: WriteBudget = field(default_factory=WriteBudget)

    def __post_init__(self) -> None:
        try:
            actions = {str(k).upper(): Action(v) for k, v in dict(self.actions).items()}
            default_action = Action(self.default_action)
        except ValueError as exc:
            raise ConfigurationError(f"unknown redaction action: {exc}") from None
        channels: dict[str, RedactionPolicy | None] = {}
        for name, sub in dict(self.channels).items():
            if sub is not None and not isinstance(sub, RedactionPolicy):
                raise ConfigurationError(
                    f"channels[{name!r}] must be a RedactionPolicy or None, not "
                    f"{type(sub).__name__}")
            channels[str(name)] = sub
        if isinstance(self.allowlist, str):
            raise ConfigurationError("allowlist must be a collection of strings, not a string")
        allowlist = frozenset(str(v) for v in self.allowlist)
        if not 0.0 <= float(self.score_threshold) <= 1.0:
            raise ConfigurationError("score_threshold must be between 0 and 1")
        if int(self.max_chars) < 1_000:
            raise ConfigurationError("max_chars must be at least 1000")
        if int(self.hard_max_chars) < int(self.max_chars):
            raise ConfigurationError("hard_max_chars must be >= max_chars")
        if not 1 <= int(self.max_depth) <= 400:
            raise ConfigurationError("max_depth must be between 1 and 400")
        if not 0.0 < float(self.time_budget) <= 3600.0:
            raise ConfigurationError("time_budget must be > 0 and at most 3600 seconds")
        object.__setattr__(self, "time_budget", float(self.time_budget))
        if int(self.max_detections) < 100:
            raise ConfigurationError("max_detections must be at least 100")
        object.__setattr__(self, "max_detections", int(self.max_detections))
        if not isinstance(self.write_budget, WriteBudget):
            raise ConfigurationError("write_budget must be a WriteBudget")
        object.__setattr__(self, "actions", MappingProxyType(actions))
        object.__setattr__(self, "default_action", default_action)
        object.__setattr__(self, "channels", MappingProxyType(channels))
        object.__setattr__(self, "allowlist", allowlist)
        object.__setattr__(self, "score_threshold", float(self.score_threshold))
        object.__setattr__(self, "max_chars", int(self.max_chars))
        object.__setattr__(self, "hard_max_chars", int(self.hard_max_chars))
        object.__setattr__(self, "max_depth", int(self.max_depth))
        object.__setattr__(self, "_folded_allowlist", frozenset(v.casefold() for v in allowlist))
        object.__setattr__(self, "_fingerprint", self._compute_fingerprint())

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def default(cls, **overrides: Any) -> RedactionPolicy:
        """Tokenize personal data, mask secrets and card numbers (see module constants)."""
        return cls(**overrides)

    @classmethod
    def strict(cls, **overrides: Any) -> RedactionPolicy:
        """Nothing reversible: every detected kind is masked, at a lower score threshold."""
        kinds = DEFAULT_TOKENIZED + DEFAULT_MASKED
        params: dict[str, Any] = {
            "actions": {kind: Action.MASK for kind in kinds},
            "default_action": Action.MASK,
            "score_threshold": 0.3,
        }
        params.update(overrides)
        return cls(**params)

    # -- queries -----------------------------------------------------------------------------
    def for_channel(self, channel: str | None) -> RedactionPolicy | None:
        """The policy for ``channel``: its override, ``None`` to skip it, or this policy."""
        if channel is None or channel not in self.channels:
            return self
        return self.channels[channel]

    def action_for(self, kind: str) -> Action:
        return self.actions.get(kind, self.default_action)

    def is_allowed(self, value: str) -> bool:
        folded: frozenset[str] = object.__getattribute__(self, "_folded_allowlist")
        return value in self.allowlist or value.casefold() in folded

    @property
    def fingerprint(self) -> str:
        """A stable digest of every setting; equal policies have equal fingerprints."""
        fp: str = object.__getattribute__(self, "_fingerprint")
        return fp

    def _compute_fingerprint(self) -> str:
        doc = {
            "actions": sorted((k, v.value) for k, v in self.actions.items()),
            "default_action": self.default_action.value,
            "channels": sorted((k, None if v is None else v.fingerprint)
                               for k, v in self.channels.items()),
            "allowlist": sorted(self.allowlist),
            "score_threshold": repr(self.score_threshold),
            "max_chars": self.max_chars,
            "hard_max_chars": self.hard_max_chars,
            "max_depth": self.max_depth,
            "time_budget": repr(self.time_budget),
            "max_detections": self.max_detections,
        }
        raw = json.dumps(doc, sort_keys=True, ensure_ascii=True).encode("ascii")
        return hashlib.sha256(raw).hexdigest()[:32]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RedactionPolicy):
            return NotImplemented
        return self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        acts = ", ".join(f"{k}={v.value}" for k, v in sorted(self.actions.items()))
        chans = {k: (None if v is None else v.fingerprint[:8]) for k, v in self.channels.items()}
        return (f"RedactionPolicy(actions={{{acts}}}, default_action={self.default_action.value},"
                f" channels={chans}, allowlist={sorted(self.allowlist)}, "
                f"score_threshold={self.score_threshold}, max_chars={self.max_chars}, "
                f"hard_max_chars={self.hard_max_chars}, max_depth={self.max_depth}, "
                f"time_budget={self.time_budget})")
