"""The recognizers of the default engine.

Every recognizer here is a :class:`LinearRecognizer`: a presidio ``EntityRecognizer`` that runs
a few compiled standard-library regular expressions whose running time is linear in the text
(every repetition is either bounded or cannot overlap a neighbouring one, and no look-behind
holds an unbounded repetition). None of them goes through presidio's ``PatternRecognizer``,
whose e-mail pattern is super-linear and which *skips* a pattern that hits its regex timeout
(the match is then lost: fail-open).

The recognizers run on the redactor's *analysis view* of the text (see
``redactor.analysis_view``): compatibility forms folded to ASCII (full-width letters, digits
and punctuation, every kind of space and dash, non-ASCII decimal digits), CJK and other
scripts blanked. Patterns therefore only deal with ASCII, and use ASCII look-arounds instead of
``\\b``. Patterns are case-sensitive unless they say otherwise (``akia…`` is no AWS key).

Validation that needs more than a pattern (Luhn and issuer ranges, ISO 7064 checksums, dates,
a public-suffix check) happens in the recognizer; label vetoes ("order no.", "version") that
need the original text are applied by the redactor (:func:`label_veto`).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tldextract
from presidio_analyzer import EntityRecognizer, RecognizerResult

logger = logging.getLogger(__name__)

CN_RESIDENT_ID = "CN_RESIDENT_ID"
CN_MOBILE = "CN_MOBILE"
API_SECRET = "API_SECRET"  # noqa: S105 - an entity name

# A validator gets (match, view) and returns the score to report, or None to drop the match.
Validator = Callable[["re.Match[str]", str], "float | None"]


@dataclass(frozen=True)
class Rx:
    """One pattern: the span reported is group ``group`` of each match."""

    name: str
    regex: re.Pattern[str]
    score: float
    validate: Validator | None = None
    group: int | str = 0
    needles: tuple[str, ...] = ()  # the pattern can only match text holding one of these
    fold_case: bool = False  # needles are compared with the lower-cased text


def rx(name: str, pattern: str, score: float, validate: Validator | None = None,
       group: int | str = 0, flags: int = 0, needles: tuple[str, ...] = (),
       fold_case: bool = False) -> Rx:
    return Rx(name, re.compile(pattern, flags | re.ASCII), score, validate, group, needles,
              fold_case)


class LinearRecognizer(EntityRecognizer):
    """A recognizer made of linear-time standard-library patterns (see the module doc)."""

    ENTITY = "PII"
    PATTERNS: Sequence[Rx] = ()

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=[self.ENTITY], name=type(self).__name__,
                         supported_language=supported_language)

    def load(self) -> None:
        return None

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        if entities and self.ENTITY not in entities:
            return []
        results: list[RecognizerResult] = []
        lower: str | None = None
        for p in self.PATTERNS:
            if p.needles:  # a substring test is far cheaper than a regex scan
                if p.fold_case:
                    lower = text.lower() if lower is None else lower
                    if not any(n in lower for n in p.needles):
                        continue
                elif not any(n in text for n in p.needles):
                    continue
            for m in p.regex.finditer(text):
                start, end = m.span(p.group)
                if start >= end:
                    continue
                score = p.score if p.validate is None else p.validate(m, text)
                if score is None or score <= 0:
                    continue
                results.append(RecognizerResult(self.ENTITY, start, end, score))
        return results


def _word_before(view: str, start: int, window: int = 40) -> str:
    """The lower-cased text in the ``window`` characters before ``start``."""
    return view[max(0, start - window):start].lower()


# --------------------------------------------------------------------------------------------
# E-mail: linear (each local-part run is scanned once; the domain is at most 30 labels)
# --------------------------------------------------------------------------------------------
_OFFLINE_TLD: tldextract.TLDExtract | None = None


def _offline_tld() -> tldextract.TLDExtract:
    """A suffix extractor that only uses tldextract's bundled snapshot: no download, no disk."""
    global _OFFLINE_TLD
    if _OFFLINE_TLD is None:
        _OFFLINE_TLD = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=(),
                                             fallback_to_snapshot=True)
    return _OFFLINE_TLD


_LOCAL = r"A-Za-z0-9._%+\-"
_EMAIL_RX = (
    rf"(?<![{_LOCAL}])[{_LOCAL}]{{1,64}}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.){1,30}[A-Za-z][A-Za-z0-9\-]{0,23}"
    r"(?![A-Za-z0-9\-]|\.[A-Za-z0-9])"
)
_SCP_PATH = re.compile(r":[A-Za-z0-9~/._\-]")
_URL_USERINFO = re.compile(r"://[^\s/@]{0,64}:$")


def _validate_email(m: re.Match[str], view: str) -> float | None:
    value = m.group(0)
    local, _, domain = value.rpartition("@")
    if not local.strip("._%+-"):
        return None
    if _SCP_PATH.match(view, m.end()) and (local == "git" or view[m.end() + 1:m.end() + 2]
                                           in "~/" or "/" in view[m.end():m.end() + 80]):
        return None  # an scp-style remote ("git@github.com:org/repo.git"), not a mailbox
    if _URL_USERINFO.search(view, max(0, m.start() - 90), m.start()):
        return None  # "scheme://user:password@host": the password is the secret here
    if _offline_tld()(domain).fqdn == "":
        return None
    return 1.0


class OfflineEmailRecognizer(LinearRecognizer):
    """E-mail addresses whose domain ends in a known public suffix (bundled snapshot)."""

    ENTITY = "EMAIL_ADDRESS"
    PATTERNS = (rx("email", _EMAIL_RX, 1.0, _validate_email, needles=("@",)),)


# --------------------------------------------------------------------------------------------
# Chinese resident identity card number (GB 11643-1999)
# --------------------------------------------------------------------------------------------
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def cn_id_check_char(first17: str) -> str:
    """The ISO 7064 MOD 11-2 check character for the first 17 digits of a resident ID."""
    total = sum(int(c) * w for c, w in zip(first17[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11]


def is_valid_cn_resident_id(value: str, *, today: datetime.date | None = None) -> bool:
    """True for an 18-character ID whose checksum is right and whose birth date is real and
    not in the future. Spaces and hyphens between groups are ignored."""
    compact = value.replace(" ", "").replace("-", "").upper()
    if len(compact) != 18 or not compact[:17].isascii() or not compact[:17].isdigit():
        return False
    if compact[0] == "0":
        return False
    try:
        born = datetime.date(int(compact[6:10]), int(compact[10:12]), int(compact[12:14]))
    except ValueError:
        return False
    if born.year < 1900 or born > (today or datetime.date.today()):
        return False
    return cn_id_check_char(compact[:17]) == compact[17]


def _validate_cn_id(m: re.Match[str], view: str) -> float | None:
    return 1.0 if is_valid_cn_resident_id(m.group(0)) else None


_NOT_ALNUM_BEFORE = r"(?<![0-9A-Za-z])"
_NOT_ALNUM_AFTER = r"(?![0-9A-Za-z])"


class CnResidentIdRecognizer(LinearRecognizer):
    """18-character PRC resident ID: region(6) + birth date(8) + sequence(3) + check(1), plain
    or grouped 6-8-4 / 6-4-4-4 by one consistent space or hyphen."""

    ENTITY = CN_RESIDENT_ID
    PATTERNS = (
        rx("cn_resident_id",
           _NOT_ALNUM_BEFORE + r"[1-9][0-9]{5}(?P<s>[ \-]?)(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])"
           r"(?:0[1-9]|[12][0-9]|3[01])(?P=s)[0-9]{3}[0-9Xx]" + _NOT_ALNUM_AFTER,
           1.0, _validate_cn_id),
        rx("cn_resident_id_6444",
           _NOT_ALNUM_BEFORE + r"[1-9][0-9]{5}(?P<s>[ \-])(?:19|20)[0-9]{2}(?P=s)"
           r"(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])(?P=s)[0-9]{3}[0-9Xx]" + _NOT_ALNUM_AFTER,
           1.0, _validate_cn_id),
    )


# --------------------------------------------------------------------------------------------
# Chinese mainland mobile number
# --------------------------------------------------------------------------------------------
class CnMobileRecognizer(LinearRecognizer):
    """Mainland mobile: optional +86 / 0086 / (+86), then 1[3-9]x and 8 digits, optionally in
    3-4-4 groups separated by one consistent space or hyphen."""

    ENTITY = CN_MOBILE
    PATTERNS = (
        rx("cn_mobile",
           r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[ \-]?|\(\+?86\)[ \-]?)?"
           r"1[3-9][0-9](?P<s>[ \-]?)[0-9]{4}(?P=s)[0-9]{4}" + _NOT_ALNUM_AFTER, 0.75),
    )


# --------------------------------------------------------------------------------------------
# Phone numbers validated by phonenumbers, one parse per candidate and region
# --------------------------------------------------------------------------------------------
_PHONE_CANDIDATE = re.compile(
    r"(?<![0-9A-Za-z+])(?:\+|00)?(?:\([0-9]{1,4}\)[ .\-]?)?[0-9](?:[ .\-]{0,2}[0-9]|"
    r"[ .\-]?\([0-9]{1,4}\)[ .\-]?[0-9]){5,17}(?![0-9A-Za-z]|[.\-][0-9])", re.ASCII)


_NON_DIGITS = re.compile(r"[^0-9]+")
_DATE_START = re.compile(r"(?:19|20)[0-9]{2}[\-. ](?:0?[1-9]|1[0-2])[\-. ](?:[0-3]?[0-9])(?![0-9])")


class LinearPhoneRecognizer(LinearRecognizer):
    """Phone numbers: digit groups (7-15 digits, optional ``+``/``00`` and one parenthesised
    group) that ``phonenumbers`` accepts as a valid number of one of ``supported_regions`` (or,
    with ``+``, of any region). Unlike presidio's ``PhoneNumberMatcher`` (which re-parses
    every inner sub-sequence of a candidate and costs seconds per 20k characters of digit-heavy
    text), each candidate is parsed at most once per region."""

    ENTITY = "PHONE_NUMBER"
    SCORE = 0.4

    def __init__(self, supported_language: str = "en",
                 supported_regions: Sequence[str] = ("US", "GB", "CN")) -> None:
        self.regions = tuple(r.upper() for r in supported_regions)
        super().__init__(supported_language)

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        if entities and self.ENTITY not in entities:
            return []
        import phonenumbers

        results: list[RecognizerResult] = []
        for m in _PHONE_CANDIDATE.finditer(text):
            value = m.group(0)
            digits = sum(c.isdigit() for c in value)
            if not 7 <= digits <= 15:
                continue
            if sum(len(g) == 1 for g in _NON_DIGITS.split(value)) >= 2:
                continue  # "1.3.6.1.4.1.2021" (an OID), "3 1 4 1 5 9 2 6": not phone groups
            if _DATE_START.match(value):
                continue  # "2024-03-08 1422", "2024.03.08 14"
            intl = value.startswith(("+", "00"))
            for region in (None,) if intl else self.regions:
                try:
                    number = phonenumbers.parse("+" + value[2:] if value.startswith("00")
                                                else value, region)
                except phonenumbers.NumberParseException:
                    continue
                if phonenumbers.is_valid_number(number):
                    results.append(RecognizerResult(self.ENTITY, m.start(), m.end(),
                                                    self.SCORE))
                    break
        return results


# --------------------------------------------------------------------------------------------
# Phone-shaped numbers that phonenumbers rejects (unassigned area codes, odd grouping)
# --------------------------------------------------------------------------------------------
_PHONE_LABEL = re.compile(
    r"(?:(?<![A-Za-z])(?:phone|tel|telephone|mobile|cell|call|fax|contact|whatsapp|sms|text me|"
    r"reach me|number|ph|mob|tfn)(?![a-z])|\u7535\u8bdd|\u624b\u673a|\u8054\u7cfb)",
    re.IGNORECASE)
_PHONE_LABEL_NEAR = 32


def _phone_label_near(view: str, start: int) -> bool:
    return _PHONE_LABEL.search(view, max(0, start - _PHONE_LABEL_NEAR), start) is not None


def _validate_nanp(m: re.Match[str], view: str) -> float | None:
    digits = [c for c in m.group(0) if c.isdigit()]
    if len(set(digits)) < 3:
        return None
    return 0.45 if _phone_label_near(view, m.start()) else 0.4


def _validate_gb(m: re.Match[str], view: str) -> float | None:
    value = m.group(0)
    digits = [c for c in value if c.isdigit()]
    if len(digits) not in (10, 11) or len(set(digits)) < 3:
        return None
    if " " not in value and "(" not in value and "-" not in value:
        return _validate_plain10(m, view)
    return 0.45 if _phone_label_near(view, m.start()) else 0.4


def _validate_plain10(m: re.Match[str], view: str) -> float | None:
    return 0.45 if _phone_label_near(view, m.start()) else None


def _validate_intl(m: re.Match[str], view: str) -> float | None:
    digits = [c for c in m.group(0) if c.isdigit()]
    if not 8 <= len(digits) <= 15 or len(set(digits)) < 4:
        return None
    return 0.45 if _phone_label_near(view, m.start()) else 0.4


class PhoneShapeRecognizer(LinearRecognizer):
    """Numbers shaped like phone numbers that the ``phonenumbers`` validation drops: NANP
    3-3-4 groups (``880.963.5169``, ``(212) 555-01234`` excluded), ``+`` and a country code
    followed by 7-14 digits (``+447700 900 657``), and ten plain digits after a phone label."""

    ENTITY = "PHONE_NUMBER"
    PATTERNS = (
        rx("nanp_grouped",
           r"(?<![0-9A-Za-z+.\-/])(?:(?:\+|00)?1[ .\-]?)?"
           r"(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}(?P<s>[ .\-]))[2-9][0-9]{2}[ .\-][0-9]{4}"
           r"(?![0-9A-Za-z]|[.\-][0-9])", 0.45, _validate_nanp),
        rx("intl_plus",
           r"(?<![0-9A-Za-z+])\+[1-9][0-9]{0,2}(?:[ .\-]?\(0?[0-9]{1,4}\))?(?:[ .\-]?[0-9]){6,13}"
           r"(?![0-9A-Za-z]|[.\-][0-9])", 0.45, _validate_intl),
        rx("gb_grouped",
           r"(?<![0-9A-Za-z+.\-/])(?:\(0[1-9][0-9]{1,4}\)|0[1-9][0-9]{2,4}) ?[0-9]{3}[ \-]?"
           r"[0-9]{3,4}(?![0-9A-Za-z]|[.\-][0-9])", 0.4, _validate_gb),
        rx("plain10_labelled", r"(?<![0-9A-Za-z+.\-])[2-9][0-9]{9}(?![0-9A-Za-z]|[.\-][0-9])",
           0.6, _validate_plain10),
    )


# --------------------------------------------------------------------------------------------
# US social security number
# --------------------------------------------------------------------------------------------
_SSN_LABEL = re.compile(r"(?:ssn|social security|soc\.? ?sec|ss#|ss no|taxpayer id)",
                        re.IGNORECASE)
_SSN_KNOWN_FAKE = frozenset({"123456789", "987654320", "078051120", "111111111"})


def _ssn_digits_ok(digits: str) -> bool:
    if len(digits) != 9 or digits in _SSN_KNOWN_FAKE or len(set(digits)) == 1:
        return False
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _ssn_validator(base: float, labelled: float, need_label: bool) -> Validator:
    def validate(m: re.Match[str], view: str) -> float | None:
        if not _ssn_digits_ok("".join(c for c in m.group(0) if c.isdigit())):
            return None
        near = _SSN_LABEL.search(view, max(0, m.start() - 40), m.start()) is not None
        if near:
            return labelled
        return None if need_label else base
    return validate


class LinearUsSsnRecognizer(LinearRecognizer):
    """US SSN: 3-2-4 digits with one consistent separator; 3-6, 5-4 and nine plain digits only
    after an SSN label (``SSN``, ``social security``)."""

    ENTITY = "US_SSN"
    _END = r"(?![0-9A-Za-z]|[.\-][0-9])"
    _START = r"(?<![0-9A-Za-z.\-])"
    PATTERNS = (
        rx("ssn_324", _START + r"[0-9]{3}(?P<s>[ .\-])[0-9]{2}(?P=s)[0-9]{4}" + _END, 0.5,
           _ssn_validator(0.5, 0.85, need_label=False)),
        rx("ssn_36_54", _START + r"(?:[0-9]{3}-[0-9]{6}|[0-9]{5}-[0-9]{4})" + _END, 0.5,
           _ssn_validator(0.4, 0.85, need_label=False)),
        rx("ssn_plain", _START + r"[0-9]{9}" + _END, 0.5,
           _ssn_validator(0.0, 0.85, need_label=True)),
    )


# --------------------------------------------------------------------------------------------
# Payment cards: issuer prefix and length table + Luhn
# --------------------------------------------------------------------------------------------
def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _in(prefix: str, lo: int, hi: int) -> bool:
    return prefix.isdigit() and lo <= int(prefix) <= hi


_ALL_LENGTHS = frozenset(range(12, 20))
_MAESTRO_IINS = frozenset({"5018", "5020", "5038", "5893", "6304", "6390", "6759", "6761",
                           "6762", "6763", "6220"})
# (predicate on the digit string, allowed lengths)
_ISSUERS: list[tuple[Callable[[str], bool], frozenset[int]]] = [
    (lambda d: d[0] == "4", frozenset({13, 16, 19})),                                 # Visa
    (lambda d: _in(d[:2], 51, 55) or _in(d[:4], 2221, 2720), frozenset({16})),         # MC
    (lambda d: d[:2] in ("34", "37"), frozenset({15})),                                # Amex
    (lambda d: d[:4] == "6011" or d[:2] == "65" or _in(d[:3], 644, 649),
     frozenset({16, 17, 18, 19})),                                                     # Discover
    (lambda d: d[:2] == "62" or d[:2] == "81", frozenset({16, 17, 18, 19})),           # UnionPay
    (lambda d: d[:2] == "35", frozenset({16, 17, 18, 19})),                            # JCB
    (lambda d: d[:4] in ("1800", "2131"), frozenset({15})),                            # JCB (old)
    (lambda d: _in(d[:4], 3088, 3102) or _in(d[:4], 3112, 3120) or _in(d[:4], 3158, 3159)
     or _in(d[:4], 3337, 3349), frozenset({16})),                                      # JCB 3xxx
    (lambda d: _in(d[:3], 300, 305) or d[:2] in ("36", "38", "39") or d[:4] == "3095",
     frozenset({14, 16, 17, 18, 19})),                                                 # Diners
    (lambda d: d[:4] in _MAESTRO_IINS, _ALL_LENGTHS),                                  # Maestro
    (lambda d: d[:2] in ("50", "56", "57", "58"),
     frozenset({12, 14, 15, 16, 17, 18, 19})),                # Maestro (13: EAN-13 barcodes)
    (lambda d: d[0] == "6", frozenset({16, 17, 18, 19})),                              # Maestro
    (lambda d: _in(d[:4], 2200, 2204), frozenset({16, 17, 18, 19})),                   # Mir
    (lambda d: d[0] == "1", frozenset({15})),                                          # UATP
    (lambda d: d[:4] in ("5019", "4571"), frozenset({16})),                            # Dankort
    (lambda d: _in(d[:6], 979200, 979289), frozenset({16})),                           # Troy
    (lambda d: d[:2] in ("60", "65") or d[:4] in ("8171", "3530"), _ALL_LENGTHS),      # RuPay
    (lambda d: _in(d[:6], 506099, 506198) or _in(d[:6], 650002, 650027),
     frozenset({16, 18, 19})),                                                         # Verve
]
# Values that pass Luhn and an issuer check but are famous non-card numbers.
_NOT_CARDS = frozenset({"2147483647", "4294967295", "9223372036854775807"})


def is_plausible_card(value: str) -> bool:
    digits = "".join(c for c in value if c in "0123456789")
    if not 12 <= len(digits) <= 19 or len(set(digits)) < 2 or digits in _NOT_CARDS:
        return False
    if not any(pred(digits) and len(digits) in lengths for pred, lengths in _ISSUERS):
        return False
    return luhn_ok(digits)


_IBAN_HEAD = re.compile(r"[A-Z]{2}[0-9]{2}[ \-]?(?:[A-Z0-9]{4}[ \-]?)*$")


def _validate_card(m: re.Match[str], view: str) -> float | None:
    if not is_plausible_card(m.group(0)):
        return None
    if _IBAN_HEAD.search(view, max(0, m.start() - 40), m.start()):
        return None  # the inner digits of an IBAN ("DE89 3704 0044 0532 0130 00")
    return 1.0


class StrictCreditCardRecognizer(LinearRecognizer):
    """Card numbers of 12-19 digits (plain, or grouped by one consistent space, hyphen or dot)
    that pass Luhn and match a known issuer prefix for their length."""

    ENTITY = "CREDIT_CARD"
    _START = r"(?<![0-9A-Za-z.\-])(?<![0-9],)"
    _END = r"(?![0-9A-Za-z]|[.,\-][0-9])"
    PATTERNS = (
        rx("card_grouped",
           _START + r"[1-8][0-9]{3}(?P<s>[ .\-])[0-9]{4,6}(?P=s)[0-9]{4,5}"
           r"(?:(?P=s)[0-9]{1,4})?(?:(?P=s)[0-9]{3})?" + _END, 1.0, _validate_card),
        rx("card_plain", _START + r"[1-8][0-9]{11,18}" + _END, 1.0, _validate_card),
    )


# --------------------------------------------------------------------------------------------
# IP addresses
# --------------------------------------------------------------------------------------------
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IPV6 = (
    rf"(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{1,7}}:|(?:{_H16}:){{1,6}}:{_H16}"
    rf"|(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}"
    rf"|(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}"
    rf"|{_H16}:(?::{_H16}){{1,6}}|:(?::{_H16}){{1,7}})"
)
_IPV4 = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
# Chinese text often glues the label to the address ("登录IP10.0.0.1"): allow a preceding "IP".
_IP_START = r"(?:(?<=[Ii][Pp])|(?<=[^0-9A-Fa-f:.]:)|(?<![0-9A-Za-z_.:]))"
_IP_LABEL = re.compile(r"(?:ip|ipv4|ipv6|addr|address|host|client|server|from|src|dst)\W{0,3}$",
                       re.IGNORECASE)


def _validate_ip(m: re.Match[str], view: str) -> float | None:
    value = m.group(0)
    try:
        ipaddress.ip_interface(value.split("%")[0])
    except ValueError:
        return None
    if ":" not in value:
        octets = value.split("/")[0].split(".")
        if all(len(o) == 1 for o in octets) and len(set(octets)) > 1 and not _IP_LABEL.search(
                view, max(0, m.start() - 12), m.start()):
            return None  # "section 3.2.1.4", "升级到 3.1.2.5": a dotted version, not a host
    return 0.6


class LabelAwareIpRecognizer(LinearRecognizer):
    """IPv4 (not part of a longer dotted number), IPv6 and IPv4-mapped IPv6 addresses; an
    address may directly follow the label "IP"."""

    ENTITY = "IP_ADDRESS"
    PATTERNS = (
        rx("ipv4", r"(?:(?<=[Ii][Pp])|(?<![0-9A-Za-z_.]))" + _IPV4
           + r"(?:/(?:3[0-2]|[12]?[0-9]))?(?![0-9A-Za-z_]|\.[0-9])",
           0.6, _validate_ip, needles=(".",)),
        rx("ipv4_mapped", _IP_START + rf"::(?:ffff(?::0{{1,4}})?:)?{_IPV4}"
           r"(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?(?![0-9A-Za-z_]|\.[0-9])", 0.6,
           _validate_ip, needles=("::",)),
        rx("ipv4_embedded", _IP_START + rf"(?:(?:{_H16}:){{1,5}}:(?:{_H16}:){{0,4}}|"
           rf"(?:{_H16}:){{6}}){_IPV4}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
           r"(?![0-9A-Za-z_]|\.[0-9])", 0.6, _validate_ip, needles=(":",)),
        rx("ipv6", _IP_START + _IPV6 + r"(?:%[0-9A-Za-z]{1,16})?"
           r"(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
           r"(?![0-9A-Za-z_:]|\.[0-9])", 0.6, _validate_ip, needles=(":",)),
    )


# --------------------------------------------------------------------------------------------
# API keys, tokens and private keys
# --------------------------------------------------------------------------------------------
_B64URL = "A-Za-z0-9_\\-"
_HAS_DIGIT = re.compile(r"[0-9]")
_HAS_ALPHA = re.compile(r"[A-Za-z]")
_HAS_UPPER = re.compile(r"[A-Z]")
_HAS_LOWER = re.compile(r"[a-z]")


def _random_looking(value: str) -> bool:
    """Random credentials mix letters and digits (or both cases); prose does not."""
    if _HAS_DIGIT.search(value) and _HAS_ALPHA.search(value):
        return True
    return bool(_HAS_UPPER.search(value) and _HAS_LOWER.search(value)
                and len(value) >= 24 and "-" not in value)


def _mixed(m: re.Match[str], view: str) -> float | None:
    body = m.group(0)
    if body.startswith("sk-"):
        body = body[3:]
    return 0.9 if _HAS_DIGIT.search(body) and _HAS_ALPHA.search(body) else None


def _mixed_group(score: float) -> Validator:
    def validate(m: re.Match[str], view: str) -> float | None:
        return score if _random_looking(m.group("v")) else None
    return validate


_LABEL_WORDS = ("secret_?access_?key", "aws_?access_?key", "aws[a-z_]{0,12}_?key",
                "aws_?secret(?:_?access)?_?key", "client_?secret",
                "api_?secret", "secret_?key", "private_?key", "api_?key", "access_?token",
                "auth_?token", "refresh_?token", "pass" + "word", "passwd", "secret", "token")
_SECRET_LABEL = "(?:" + "|".join(_LABEL_WORDS) + ")"
def _atomic(name: str, body: str) -> str:
    """``body`` matched as an atomic group (no backtracking into it), as group ``name``:
    Python < 3.11 has no possessive quantifiers; a captured look-ahead is equivalent."""
    return f"(?=(?P<{name}_>{body}))(?P<{name}>(?P={name}_))"


_SECRET_PATTERNS: tuple[Rx, ...] = (
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...), Anthropic (sk-ant-...), and similar.
    rx("openai_style", rf"(?<![{_B64URL}])sk-[{_B64URL}]{{20,}}(?![{_B64URL}])", 0.9, _mixed,
       needles=("sk-",)),
    # Stripe live/test secret and restricted keys.
    rx("stripe", r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}(?![A-Za-z0-9_])",
       0.95, needles=("sk_", "rk_")),
    # AWS access key ids (long-term AKIA, temporary ASIA).
    rx("aws_access_key_id", r"(?<![A-Za-z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|"
       r"AIPA|ANPA|ANVA)[A-Z0-9]{16}(?![A-Za-z0-9])", 0.95,
       needles=("A3T", "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA",
                "ANVA")),
    # A 40-character AWS secret access key (or any labelled secret) after its label:
    # "aws_secret_access_key = …", "SecretAccessKey": "…", "aws configure set
    # aws_secret_access_key …", "password: …". The label and separator are bounded.
    rx("aws_secret_labelled",
       rf"(?i:{_SECRET_LABEL})[\"']?[ \t]{{0,4}}(?:[:=]|=>|[ \t])[ \t]{{0,4}}[\"']?"
       r"(?P<v>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])", 0.95, _mixed_group(0.95), "v",
       needles=("key", "secret"), fold_case=True),
    rx("labelled_secret",
       rf"(?i:{_SECRET_LABEL})[\"']?[ \t]{{0,4}}(?:[:=]|=>)[ \t]{{0,4}}[\"']?"
       + _atomic("v", r"[A-Za-z0-9_\-+/=.~!@#$%^&*]{8,200}")
       + r"(?![A-Za-z0-9_\-+/=.~!@#$%^&*])", 0.7, _mixed_group(0.7), "v",
       needles=("secret", "key", "token", "passw"), fold_case=True),
    # GitHub classic tokens and fine-grained PATs.
    rx("github_token", r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])", 0.95,
       needles=("gh",)),
    rx("github_pat", r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,255}(?![A-Za-z0-9_])", 0.95,
       needles=("github_pat_",)),
    # GitLab personal/project/group tokens and friends.
    rx("gitlab_token", r"(?<![A-Za-z0-9_\-])gl(?:pat|dt|ptt|rt|cbt|oas|soat|ft|imt|agent)-"
       r"[A-Za-z0-9_\-]{20,64}(?![A-Za-z0-9_\-])", 0.95, needles=("gl",)),
    rx("gitlab_runner", r"(?<![A-Za-z0-9_\-])GR1348941[A-Za-z0-9_\-]{20,64}(?![A-Za-z0-9_\-])",
       0.95, needles=("GR1348941",)),
    # npm: the token in an .npmrc "_authToken=" line (whatever its shape)
    rx("npmrc_token", r":_authToken=[ \t]{0,2}(?P<v>[^\s\"'$][^\s\"']{6,200})", 0.9, None, "v",
       needles=("_authToken",)),
    # Discord bot tokens: base64(user id).timestamp.hmac
    rx("discord_bot", r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{23,28}\.[A-Za-z0-9_\-]{6,7}\."
       r"[A-Za-z0-9_\-]{27,40}(?![A-Za-z0-9_\-])", 0.85, _mixed),
    # PyPI upload tokens (macaroons)
    rx("pypi_token", r"(?<![A-Za-z0-9_\-])pypi-AgE[A-Za-z0-9_\-]{50,}", 0.95, needles=("pypi-",)),
    # Hugging Face access tokens.
    rx("huggingface", r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,40}(?![A-Za-z0-9_])", 0.9,
       needles=("hf_",)),
    # npm access tokens.
    rx("npm_token", r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9_])", 0.95,
       needles=("npm_",)),
    # SendGrid API keys.
    rx("sendgrid", r"(?<![A-Za-z0-9_\-])SG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}"
       r"(?![A-Za-z0-9_\-])", 0.95, needles=("SG.",)),
    # Telegram bot tokens: bot id, colon, 35-character secret (both halves are the secret).
    rx("telegram_bot", r"(?<![A-Za-z0-9_:])[0-9]{6,12}:AA[A-Za-z0-9_\-]{33}(?![A-Za-z0-9_\-])",
       0.95, needles=(":AA",)),
    # Azure storage account keys and connection strings' secrets.
    rx("azure_account_key", r"(?i:AccountKey|SharedAccessKey|AccessKey)=(?P<v>[A-Za-z0-9+/]"
       r"{20,100}={0,2})", 0.95, None, "v", needles=("accesskey", "accountkey"), fold_case=True),
    rx("azure_sas_sig", r"(?<![A-Za-z0-9])sig=(?P<v>[A-Za-z0-9%+/]{30,100}(?:%3D|=){0,2})",
       0.9, None, "v", needles=("sig=",)),
    # Slack tokens.
    rx("slack_token", r"(?<![A-Za-z0-9\-])xox[abposre]-[A-Za-z0-9\-]{10,}(?![A-Za-z0-9\-])", 0.9,
       needles=("xox",)),
    rx("slack_webhook", r"hooks\.slack\.com/services/(?P<v>T[A-Za-z0-9_]{6,}/B[A-Za-z0-9_]{6,}/"
       r"[A-Za-z0-9_]{16,})", 0.95, None, "v", needles=("hooks.slack.com",)),
    # Google API keys.
    rx("google_api_key", r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])", 0.9,
       needles=("AIza",)),
    # JSON Web Tokens: header.payload[.signature]; header and payload are base64url JSON.
    rx("jwt", rf"(?<![.{_B64URL}])eyJ[{_B64URL}]{{5,}}\.eyJ[{_B64URL}]{{5,}}"
       rf"(?:\.[{_B64URL}]*)?(?![{_B64URL}])", 0.95, needles=("eyJ",)),
    # The credential after an HTTP "Bearer"/"Basic"/"token" scheme (the word itself is kept).
    rx("bearer", r"(?<![A-Za-z])(?:Bearer|bearer|BEARER|Basic|token|Token)[ \t]{1,4}"
       r"(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)(?![A-Za-z0-9._~+/=\-])", 0.85, _mixed_group(0.85),
       "v", needles=("bearer", "basic", "token"), fold_case=True),
    # The password in a URL's user-info: scheme://user:password@host
    rx("url_password", r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,20}://"
       r"[A-Za-z0-9._%~!$&'()*+,;=\-]{0,64}:(?P<v>[^\s:/@]{1,128})@", 0.9, None, "v",
       needles=("://",)),
)
_PEM_BEGIN = re.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_BODY = re.compile(r"(?:(?:\r?\n|\\r|\\n|[ \t])+[A-Za-z0-9+/=:\-,]{16,})*")
_PEM_MAX = 32_768


class ApiSecretRecognizer(LinearRecognizer):
    """API keys, access tokens, JWTs, labelled secrets, URL passwords and private keys.

    Private-key blocks are paired in one linear pass (each BEGIN with the first END after
    it); a header without an END takes the base64 lines that follow it."""

    ENTITY = API_SECRET
    PATTERNS = _SECRET_PATTERNS

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        results = super().analyze(text, entities, nlp_artifacts, regex_flags)
        results.extend(RecognizerResult(self.ENTITY, s, e, score)
                       for s, e, score in private_key_spans(text))
        return results


def private_key_spans(text: str) -> list[tuple[int, int, float]]:
    """(start, end, score) of private-key blocks: each BEGIN paired with the first END after
    it (at most ``_PEM_MAX`` characters on), else the header plus the base64 lines after it
    (bounded the same way). Linear: one pass for the ENDs, one for the BEGINs."""
    if "-----BEGIN" not in text:
        return []
    import bisect

    ends = [m.end() for m in _PEM_END.finditer(text)]
    out: list[tuple[int, int, float]] = []
    for m in _PEM_BEGIN.finditer(text):
        i = bisect.bisect_left(ends, m.end())
        if i < len(ends) and ends[i] - m.start() <= _PEM_MAX:
            out.append((m.start(), ends[i], 1.0))
        else:
            body = _PEM_BODY.match(text, m.end(), m.end() + _PEM_MAX)
            out.append((m.start(), body.end() if body is not None else m.end(), 0.99))
    return out


# --------------------------------------------------------------------------------------------
# Label vetoes: a few weak kinds are dropped when the text right before them names something
# that is not personal data ("版本号 1.2.0.4", "Order No. 2023111500", "运单号: 4001234567"),
# or when the number is glued to an identifier ("INV-2723916661", "uid=12894277801").
# Applied by the redactor to the original text.
# --------------------------------------------------------------------------------------------
_VERSION_LABEL = (r"v|ver|version|rev|revision|build|release|firmware|fw|sdk|section|sec|"
                  r"chapter|clause|step|\u00a7|\u7248\u672c|\u7248\u672c\u53f7|\u56fa\u4ef6|"
                  r"\u5185\u6838|\u5347\u7ea7\u5230|\u66f4\u65b0\u5230")
_REFERENCE_LABEL = (r"created_?at|updated_?at|expires?_?at|exp|iat|nbf|time|date|since|until|"
                    r"imei|ean|upc|gtin|isbn|barcode|\u6761\u5f62\u7801|\u65f6\u95f4\u6233|"
                    r"order|tracking|invoice|inv|sku|serial|batch|ticket|case|ref|reference|"
                    r"txn|transaction|po|awb|waybill|meeting|conference|webinar|room|uid|pid|"
                    r"id|user_?id|account_?id|max|min|timestamp|ts|epoch|offset|seed|zip|zip ?code|"
                    r"postal|postcode|"
                    r"\u4f1a\u8bae|\u4f1a\u8bae\u53f7|\u4f1a\u8bae\u5ba4|\u7fa4\u53f7|"
                    r"\u623f\u95f4\u53f7|\u8ba2\u5355|\u5355\u53f7|\u8ba2\u5355\u53f7|\u8fd0\u5355|"
                    r"\u8fd0\u5355\u53f7|\u5feb\u9012\u5355\u53f7|\u7269\u6d41\u5355\u53f7|"
                    r"\u53d1\u7968|\u53d1\u7968\u53f7|\u6d41\u6c34\u53f7|\u4ea4\u6613\u53f7|"
                    r"\u7f16\u53f7|\u5e8f\u5217\u53f7|\u6279\u6b21|\u6279\u6b21\u53f7|\u5de5\u5355|"
                    r"\u5de5\u5355\u53f7|\u5b66\u53f7|\u5de5\u53f7|\u8d27\u53f7|\u578b\u53f7")
_LABEL_TAIL = (r"\s*(?:no\.?|number|num|id|#|\u53f7|\u53f7\u7801|\u7801)?\s*"
               r"[:\uff1a#\uff03=]?\s*(?:\u662f|\u4e3a)?\s*$")
_REFERENCE_VETO = re.compile(rf"(?<![A-Za-z])(?:{_REFERENCE_LABEL}){_LABEL_TAIL}", re.IGNORECASE)
# "Chrome/122.0.6261.112", "int max = 2147483647", "INV-2723916661", "uid=12894277801"
_GLUED_ID = re.compile(r"(?:[A-Za-z][A-Za-z0-9_]*[\-_#/=:]|[A-Za-z_][A-Za-z0-9_]*\s{0,2}=\s{0,2}|"
                       r"[0-9]\.)$")
_PHONE_KEY = re.compile(r"(?:phone|tel|mobile|cell|fax|call|contact|whatsapp|sms|ssn|card|"
                        r"cc|pan)[A-Za-z0-9_]*[\s\"']{0,2}[\-_#/=:]\s{0,2}$", re.IGNORECASE)
LABEL_VETOES: dict[str, re.Pattern[str]] = {
    "IP_ADDRESS": re.compile(rf"(?<![A-Za-z])(?:{_VERSION_LABEL})\.?{_LABEL_TAIL}",
                             re.IGNORECASE),
    "PHONE_NUMBER": _REFERENCE_VETO,
    "CN_MOBILE": _REFERENCE_VETO,
    "US_SSN": _REFERENCE_VETO,
    "CREDIT_CARD": re.compile(r"(?<![A-Za-z])(?:order|tracking|invoice|inv|awb|waybill|imei|ean|"
                              r"upc|gtin|isbn|barcode|\u6761\u5f62\u7801|"
                              r"\u5546\u54c1\u6761\u5f62\u7801|"
                              r"\u8ba2\u5355\u53f7|\u8fd0\u5355\u53f7|\u5feb\u9012\u5355\u53f7)"
                              + _LABEL_TAIL, re.IGNORECASE),
}
_GLUED_KINDS = frozenset({"PHONE_NUMBER", "CN_MOBILE", "US_SSN", "CREDIT_CARD"})
_AFTER_VETO = re.compile(r"\s{0,2}(?:\u7248\u672c|\u7248|version|release)", re.IGNORECASE)
_VETO_WINDOW = 24


def label_veto(kind: str, text: str, start: int, end: int | None = None) -> bool:
    """True when the entity of ``kind`` at ``start``/``end`` follows a non-PII label, is glued
    to an identifier, or (IP addresses) is followed by a version label."""
    pattern = LABEL_VETOES.get(kind)
    if pattern is None:
        return False
    lo = max(0, start - _VETO_WINDOW)
    if pattern.search(text, lo, start) is not None:
        return True
    if end is not None and kind in _GLUED_KINDS:
        if "".join(c for c in text[start:end] if c.isdigit()) in _NOT_CARDS:
            return True  # 2147483647 and friends
        if _IBAN_HEAD.search(text, max(0, start - 40), start):
            return True  # digits inside an IBAN
    if kind in _GLUED_KINDS and _GLUED_ID.search(text, lo, start) is not None:
        return _PHONE_KEY.search(text, lo, start) is None
    if kind == "IP_ADDRESS" and end is not None and _AFTER_VETO.match(text, end):
        return True
    return False


__all__ = [
    "API_SECRET",
    "CN_MOBILE",
    "CN_RESIDENT_ID",
    "ApiSecretRecognizer",
    "CnMobileRecognizer",
    "CnResidentIdRecognizer",
    "EntityRecognizer",
    "LabelAwareIpRecognizer",
    "LinearPhoneRecognizer",
    "LinearRecognizer",
    "LinearUsSsnRecognizer",
    "OfflineEmailRecognizer",
    "PhoneShapeRecognizer",
    "StrictCreditCardRecognizer",
    "cn_id_check_char",
    "is_plausible_card",
    "is_valid_cn_resident_id",
    "label_veto",
    "luhn_ok",
]


# A cheap, conservative pre-filter on the analysis view: text in which none of these shapes
# occurs cannot match any built-in recognizer, so no recognizer is called for it (most chat
# turns). Every recognizer above needs one of: an "@", seven or more digits (separators
# allowed), a dotted quad or a hex:hex: IPv6 shape, a long alphanumeric run (keys, tokens,
# crypto addresses, IBANs) or a secret's label/prefix.
CANDIDATE_RE = re.compile(
    r"@"
    r"|[0-9](?:[\s\-.()/]{0,3}[0-9]){6,}"
    r"|[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"
    r"|[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:"
    r"|[A-Za-z0-9_\-+/=]{20,}"
    r"|sk[-_]|rk_|AKIA|ASIA|gh[pousr]_|github_pat_|gl[a-z]{1,5}-|hf_|npm_|SG\.|eyJ|BEGIN|"
    r"xox[abposre]-|AIza|://"
    r"|(?i:bearer|basic|secret|passw|pwd|api[_-]?key|token|aws|accountkey|sig=)",
    re.ASCII,
)
