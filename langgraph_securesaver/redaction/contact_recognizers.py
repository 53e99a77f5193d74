"""Recognizers of contact data and Chinese identity numbers: e-mail addresses (offline
public-suffix check), Chinese resident identity card numbers (GB 11643-1999 checksum), Chinese
mainland mobiles, phone numbers (phonenumbers-validated, and phone-shaped numbers).

Each is a :class:`~.linear.LinearRecognizer`; knows nothing of the redactor.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

import tldextract
from presidio_analyzer import RecognizerResult

from .linear import CN_MOBILE, CN_RESIDENT_ID, LinearRecognizer, rx
from .windows import window_end, window_start

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
# an apostrophe inside the local part ("o'connor@", "dan.o'brien@"; RFC 5322 atext), never
# first or last (a quote around an address is not part of it)
_EMAIL_RX = (
    rf"(?<![{_LOCAL}])(?:[{_LOCAL}]{{1,64}}'(?=[{_LOCAL}]))?[{_LOCAL}]{{1,64}}@"
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
    ahead = view[m.end():window_end(view, m.end(), m.end() + 80)]
    if _SCP_PATH.match(ahead) and (local == "git" or ahead[1:2] in "~/" or "/" in ahead):
        return None  # an scp-style remote ("git@github.com:org/repo.git"), not a mailbox
    if _URL_USERINFO.search(view, window_start(view, max(0, m.start() - 90), m.start()),
                            m.start()):
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
# an extension after a number: "x5924", " ext. 12", " extension 7", " #205" (Faker writes
# "+1-212-555-0147x1234", "+49(0)30 901820x77"): part of the number's span
_EXTENSION = r"(?:[ ,]{0,2}(?:x|X|ext\.?|Ext\.?|EXT\.?|extension|#) ?[0-9]{1,6})?"
_EXT_TAIL = re.compile(r"[ ,]{0,2}(?:x|X|ext\.?|Ext\.?|EXT\.?|extension|#) ?[0-9]{1,6}$")
_CN_SHAPES = frozenset({(11,), (3, 4, 4), (3, 8), (7, 4), (4, 3, 4), (4, 4, 3)})
_CN_PREFIX = re.compile(r"(?:(?:\+|00)86[ \-]?|\(\+?86\)[ \-]?)")


def _validate_cn_mobile(m: re.Match[str], view: str) -> float | None:
    """One kind of separator, in the groupings people write (3-4-4, 3-8, 7-4, 4-3-4, 4-4-3);
    "151940 12996" (a time of day, then a pid) is not one."""
    value = _EXT_TAIL.sub("", m.group(0))  # an extension is part of the span, not the shape
    head = _CN_PREFIX.match(value)
    body = value[head.end():] if head else value
    seps = {c for c in body if not c.isdigit()}
    shape = tuple(len(g) for g in re.split(r"[ \-]", body))
    if len(seps) > 1 or shape not in _CN_SHAPES:
        return None
    return 0.75


class CnMobileRecognizer(LinearRecognizer):
    """Mainland mobile: optional +86 / 0086 / (+86), then 1[3-9]x and 8 digits, optionally in
    the groupings of :data:`_CN_SHAPES`, separated by one kind of space or hyphen."""

    ENTITY = CN_MOBILE
    PATTERNS = (
        rx("cn_mobile",
           r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[ \-]?|\(\+?86\)[ \-]?)?"
           r"1[3-9][0-9](?:[ \-]?[0-9]){8}" + _EXTENSION + _NOT_ALNUM_AFTER, 0.75,
           _validate_cn_mobile),
    )


# --------------------------------------------------------------------------------------------
# Phone numbers validated by phonenumbers, one parse per candidate and region
# --------------------------------------------------------------------------------------------
_PHONE_CANDIDATE = re.compile(
    r"(?<![0-9A-Za-z+])(?P<n>(?:\+|00)?(?:\([0-9]{1,4}\)[ .\-]?)?[0-9](?:[ .\-]{0,2}[0-9]|"
    r"[ .\-]?\([0-9]{1,4}\)[ .\-]?[0-9]){5,17})" + _EXTENSION +
    r"(?![0-9A-Za-z]|[.\-][0-9])", re.ASCII)


_NON_DIGITS = re.compile(r"[^0-9]+")
_GROUP_HEAD = re.compile(r"\(?[0-9]*")
# right before a plain digit run: it is the value of a field ("Seq: ", "ack=", "[", "#")
_VALUE_MARK = re.compile(r"[:=\[#/,|]")
_COMPACT_DATE = re.compile(r"(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])"
                           r"[\-T_ :.][0-2]?[0-9](?![0-9])")
_DATE_START = re.compile(r"(?:19|20)[0-9]{2}[\-. ](?:0?[1-9]|1[0-2])[\-. ](?:[0-3]?[0-9])(?![0-9])")


def _cn_national(value: str) -> bool:
    """A mainland number written nationally: with the trunk 0 (``010-12345678``) or a mobile.
    Without them "1074289164" would be a Beijing line: any ten digits starting with 10."""
    digits = "".join(c for c in value if c.isdigit())
    return digits.startswith("0") or (len(digits) == 11 and digits[1] in "3456789")


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
            value = m.group("n")  # the number; its span includes the extension
            digits = sum(c.isdigit() for c in value)
            if not 7 <= digits <= 15:
                continue
            if sum(len(g) == 1 for g in _NON_DIGITS.split(value)) >= 2:
                continue  # "1.3.6.1.4.1.2021" (an OID), "3 1 4 1 5 9 2 6": not phone groups
            if _DATE_START.match(value) or _COMPACT_DATE.match(value):
                continue  # "2024-03-08 1422", "2024.03.08 14", "20171223-22" (date-hour)
            if (value.isdigit() and (digits < 10 or (value[0] != "0"
                                     and _VALUE_MARK.search(text, max(0, m.start() - 2),
                                                            m.start())))
                    and not _phone_label_near(text, m.start())):
                continue  # "2596321", "Seq: 2502126767": counts, ids and logged values
            intl = value.startswith(("+", "00"))
            head = _GROUP_HEAD.match(value)
            if not intl and head is not None and len(head.group(0)) >= 6 and not value.isdigit():
                continue  # "301526 2797", "240717 3664": a time or a counter, then a pid
            for region in (None,) if intl else self.regions:
                if region == "CN" and not _cn_national(value):
                    continue
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
    r"(?:(?<![A-Za-z])(?:phones?|tel|telephone|mobiles?|cell|call|fax|contact|whatsapp|sms|text me|"
    r"reach me|numbers?|ph|mob|tfn)(?![a-z])|\u7535\u8bdd|\u624b\u673a|\u8054\u7cfb"
    r"|(?<![A-Za-z0-9_])(?:to|from|msisdn|caller|callee|callback|recipient)[\"']?\s{0,2}[=:])",
    re.IGNORECASE)
_PHONE_LABEL_NEAR = 32


def _phone_label_near(view: str, start: int) -> bool:
    lo = window_start(view, max(0, start - _PHONE_LABEL_NEAR), start)
    return _PHONE_LABEL.search(view, lo, start) is not None


def _validate_nanp(m: re.Match[str], view: str) -> float | None:
    digits = [c for c in _EXT_TAIL.sub("", m.group(0)) if c.isdigit()]
    if len(set(digits)) < 3:
        return None
    return 0.45 if _phone_label_near(view, m.start()) else 0.4


def _validate_gb(m: re.Match[str], view: str) -> float | None:
    value = _EXT_TAIL.sub("", m.group(0))
    digits = [c for c in value if c.isdigit()]
    if len(digits) not in (10, 11) or len(set(digits)) < 3:
        return None
    if " " not in value and "(" not in value and "-" not in value:
        return _validate_plain10(m, view)
    return 0.45 if _phone_label_near(view, m.start()) else 0.4


def _validate_plain10(m: re.Match[str], view: str) -> float | None:
    return 0.45 if _phone_label_near(view, m.start()) else None


def _validate_intl(m: re.Match[str], view: str) -> float | None:
    digits = [c for c in _EXT_TAIL.sub("", m.group(0)) if c.isdigit()]
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
           r"(?:\([0-9]{3}\) ?|[0-9]{3}[ .\-])[0-9]{3}[ .\-][0-9]{4}" + _EXTENSION +
           r"(?![0-9A-Za-z]|[.\-][0-9])", 0.45, _validate_nanp),
        rx("intl_plus",
           r"(?<![0-9A-Za-z+])\+[1-9][0-9]{0,2}(?:[ .\-]?\(0?[0-9]{1,4}\))?(?:[ .\-]?[0-9]){6,13}"
           + _EXTENSION + r"(?![0-9A-Za-z]|[.\-][0-9])", 0.45, _validate_intl),
        rx("gb_344",
           r"(?<![0-9A-Za-z+.\-/])0[1-9][0-9](?P<s>[ \-])[0-9]{4}(?P=s)[0-9]{4}" + _EXTENSION +
           r"(?![0-9A-Za-z]|[.\-][0-9])", 0.4, _validate_gb),
        rx("gb_grouped",
           r"(?<![0-9A-Za-z+.\-/])(?:\(0[1-9][0-9]{1,4}\)|0[1-9][0-9]{1,4}) ?[0-9]{3}[ \-]?"
           r"[0-9]{3,4}" + _EXTENSION + r"(?![0-9A-Za-z]|[.\-][0-9])", 0.4, _validate_gb),
        rx("plain10_labelled", r"(?<![0-9A-Za-z+.\-])[2-9][0-9]{9}(?![0-9A-Za-z]|[.\-][0-9])",
           0.6, _validate_plain10),
    )
