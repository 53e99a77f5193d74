"""Numbers as data: ints, floats and ``Decimal`` values in state and in parsed JSON are
personal data when their digits are (a card number, a phone number stored as an int).

A number is a candidate when it is a non-negative integral value of 9-19 digits (7-8 after
an SSN name, whose leading zero an int loses). Its digits are analyzed as the text
``"<name>: <digits>"``, the name being the nearest dictionary key or field name (so the
label rules of text apply), and a detection must cover all the digits. Counters, steps,
timestamps and ids are kept: checksummed kinds (cards, resident IDs) are redacted unless
the name is an id/time/order name, the weak kinds (phones, SSNs) only when the name says
what they are (``phone``, ``mobile``, ``ssn``...). A redacted number becomes a string: the
token or mask it would have been in text.

The same named-context rule helps short digit strings whose name carries the only hint
(``{"ssn": "078051121"}``). :class:`NumberRedaction` is a base class of the redactor.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from ..keys.material import SecretBytes
from .caches import Cached
from .number_recognizers import luhn_ok
from .policy import Action, RedactionPolicy
from .types import Entity, VaultEntry

NUMBER_TYPES = (int, float, Decimal)
_MIN_DIGITS, _MAX_DIGITS = 9, 19
# kinds whose digits prove themselves (checksum + issuer range / birth date)
CHECKSUMMED = frozenset({"CREDIT_CARD", "CN_RESIDENT_ID"})
# a name that says the value is personal data
PII_NAME = re.compile(
    r"(?<![a-z])(?:phones?|tel|telephone|mobiles?|cell|cellphone|fax|sms|whatsapp|msisdn|"
    r"contact|caller|callee|recipient|to|number|ssn|social security|ss no|tin|itin|cards?|"
    r"cc|pan|credit|debit|cardnumber|\u624b\u673a|\u7535\u8bdd|\u8eab\u4efd\u8bc1|"
    r"\u5361\u53f7)(?![a-z])", re.IGNORECASE)
_SSN_NAME = re.compile(r"(?<![a-z])(?:ssn|social security|ss no)(?![a-z])", re.IGNORECASE)
# a name that says the value is a counter, an id, a time or a reference
REFERENCE_NAME = re.compile(
    r"(?<![a-z])(?:ids?|uid|pid|key|step|count|counter|total|size|bytes|len|length|index|idx|"
    r"offset|seq|sequence|version|ver|rev|ts|time|timestamp|epoch|date|created|updated|"
    r"expires?|exp|iat|nbf|ms|ns|seconds|millis|nanos|order|invoice|tracking|sku|ean|upc|"
    r"gtin|isbn|imei|serial|seed|hash|checksum|crc|nonce|port|price|amount|balance|run|"
    r"thread|checkpoint|trace|span)(?![a-z])", re.IGNORECASE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_DIGITISH = re.compile(r"\+?[0-9][0-9 ().\-]{5,22}[0-9]", re.ASCII)


def number_digits(value: Any, name: str | None) -> str | None:
    """The digits of a candidate number (see the module docstring), else None."""
    cls = type(value)
    if cls is int:
        n = value
    elif cls is float:
        if not math.isfinite(value) or not value.is_integer():
            return None
        n = int(value)
    elif cls is Decimal:
        if not value.is_finite() or value != value.to_integral_value():
            return None
        n = int(value)
    else:
        return None
    if n < 1_000_000:
        return None
    digits = str(n)
    if len(digits) < _MIN_DIGITS:
        if len(digits) >= 7 and name and _SSN_NAME.search(name_words(name)):
            return digits.zfill(9)
        return None
    return digits if len(digits) <= _MAX_DIGITS else None


def name_words(name: str) -> str:
    """``customerPhone_no`` -> ``customer Phone no`` (at most the last 40 characters)."""
    return _CAMEL.sub(" ", name[-40:]).replace("_", " ").replace("-", " ").replace(".", " ")


def accepts(kind: str, name: str | None) -> bool:
    """Whether a detection of ``kind`` in a value named ``name`` is personal data."""
    words = name_words(name) if name else ""
    if words and PII_NAME.search(words):
        return True
    if kind == "CN_RESIDENT_ID":
        return True  # checksum and a real birth date: an "id" name is what it is
    if kind in CHECKSUMMED:
        return not (words and REFERENCE_NAME.search(words))
    return False


def worth_analyzing(digits: str, name: str | None) -> bool:
    """Cheap pre-check: without a PII name only a checksummed kind can be accepted, so the
    digits must be card- or resident-ID-shaped (most counters, ids and times stop here)."""
    if name and PII_NAME.search(name_words(name)):
        return True
    return len(digits) == 18 or (12 <= len(digits) <= 19 and luhn_ok(digits))


class NumberRedaction:
    """The named-context half of the redactor: numbers, and digit strings by name."""

    def _redact_plain(self, s: str, call: Any) -> Cached:
        raise NotImplementedError

    @staticmethod
    def _apply(text: str, entities: Any, policy: RedactionPolicy,
               key: SecretBytes) -> tuple[str, list[VaultEntry]]:
        raise NotImplementedError

    def _named_entity(self, digits: str, name: str | None, call: Any) -> Entity | None:
        """The detection covering all of ``digits`` analyzed after its name, if accepted."""
        prefix = f"{name_words(name)}: " if name else ""
        text = prefix + digits
        entry = self._redact_plain(text, call)
        for e in entry.entities:
            if e.start <= len(prefix) and e.end >= len(text) and accepts(e.kind, name):
                return Entity(e.kind, 0, len(digits), e.score, digits)
        return None

    def _redact_number(self, value: Any, name: str | None, call: Any) -> Any:
        """``value`` itself, or the string its digits become once redacted."""
        digits = number_digits(value, name)
        if digits is None or not worth_analyzing(digits, name):
            return value
        entity = self._named_entity(digits, name, call)
        if entity is None or call.policy.action_for(entity.kind) is Action.KEEP:
            return value
        out, vault = self._apply(digits, [entity], call.policy, call.key)
        call.add(vault)
        return out

    def _redact_str_named(self, s: str, name: str | None, call: Any) -> str:
        """A string redacted as text; a short digit string nothing was found in is tried
        again after its name (``{"ssn": "078051121"}``)."""
        entry = self._redact_plain(s, call)
        if entry.vault:
            call.add(entry.vault)
        if (entry.entities or not name or len(s) > 26 or not _DIGITISH.fullmatch(s)
                or not PII_NAME.search(name_words(name))):
            return entry.text
        entity = self._named_entity(s, name, call)
        if entity is None or call.policy.action_for(entity.kind) is Action.KEEP:
            return entry.text
        out, vault = self._apply(s, [entity], call.policy, call.key)
        call.add(vault)
        return out
