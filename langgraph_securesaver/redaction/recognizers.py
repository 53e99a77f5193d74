"""Presidio recognizers for what presidio does not ship, plus offline-safe variants of a few
that it does.

Every recognizer here is a small ``PatternRecognizer`` subclass with fixed regex flags:
presidio compiles patterns with ``IGNORECASE`` by default, which would make ``akia…`` look
like an AWS key, so :class:`_FixedFlagsRecognizer` always passes its own flags.

Patterns use ASCII look-arounds instead of ``\\b``: the redactor analyzes a copy of the text in
which CJK and full-width characters are blanked or folded (see ``redactor.analysis_view``), but
custom patterns stay safe on raw text too.
"""

from __future__ import annotations

import datetime
import logging
import re as std_re
from collections.abc import Callable
from typing import Any

import regex as re
import tldextract
from presidio_analyzer import EntityRecognizer, Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IpRecognizer,
)

logger = logging.getLogger(__name__)

CN_RESIDENT_ID = "CN_RESIDENT_ID"
CN_MOBILE = "CN_MOBILE"
API_SECRET = "API_SECRET"  # noqa: S105 - an entity name

# Case-sensitive on purpose (no IGNORECASE).
_FLAGS = re.DOTALL | re.MULTILINE


class _FixedFlagsRecognizer(PatternRecognizer):
    """A PatternRecognizer whose regex flags cannot be overridden by the registry or caller."""

    FLAGS: int = _FLAGS

    def __init__(self, supported_entity: str, patterns: list[Pattern],
                 supported_language: str, name: str) -> None:
        super().__init__(supported_entity=supported_entity, name=name,
                         supported_language=supported_language, patterns=patterns,
                         global_regex_flags=self.FLAGS)

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        self.global_regex_flags = self.FLAGS
        result: list[RecognizerResult] = super().analyze(
            text, entities, nlp_artifacts, regex_flags=self.FLAGS)
        return result


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
    not in the future. Spaces and hyphens between the 6-8-4 groups are ignored."""
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


class CnResidentIdRecognizer(_FixedFlagsRecognizer):
    """18-character PRC resident ID: region(6) + birth date(8) + sequence(3) + check(1)."""

    PATTERNS = [
        Pattern(
            "cn_resident_id",
            r"(?<![0-9A-Za-z])[1-9][0-9]{5}(?P<s>[ -]?)(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])"
            r"(?:0[1-9]|[12][0-9]|3[01])(?P=s)[0-9]{3}[0-9Xx](?![0-9A-Za-z])",
            0.5,
        ),
    ]

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(CN_RESIDENT_ID, list(self.PATTERNS), supported_language,
                         name="CnResidentIdRecognizer")

    def validate_result(self, pattern_text: str) -> bool:
        return is_valid_cn_resident_id(pattern_text)


# --------------------------------------------------------------------------------------------
# Chinese mainland mobile number
# --------------------------------------------------------------------------------------------
class CnMobileRecognizer(_FixedFlagsRecognizer):
    """Mainland mobile: optional +86 / 0086 / (+86), then 1[3-9]x and 8 digits, optionally in
    3-4-4 groups separated by one consistent space or hyphen."""

    PATTERNS = [
        Pattern(
            "cn_mobile",
            r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[ -]?|\(\+?86\)[ -]?)?"
            r"1[3-9][0-9](?P<s>[ -]?)[0-9]{4}(?P=s)[0-9]{4}(?![0-9A-Za-z])",
            0.75,
        ),
    ]

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(CN_MOBILE, list(self.PATTERNS), supported_language,
                         name="CnMobileRecognizer")


# --------------------------------------------------------------------------------------------
# API keys, tokens and private keys
# --------------------------------------------------------------------------------------------
_B64URL = "A-Za-z0-9_-"
_SECRET_PATTERNS = [
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...), Anthropic (sk-ant-...), and similar.
    Pattern("openai_style", rf"(?<![{_B64URL}])sk-[{_B64URL}]{{20,}}(?![{_B64URL}])", 0.9),
    # Stripe live/test secret and restricted keys.
    Pattern("stripe", r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
            r"(?![A-Za-z0-9_])", 0.95),
    # AWS access key ids (long-term AKIA, temporary ASIA).
    Pattern("aws_access_key_id", r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z2-7]{16}(?![A-Za-z0-9])",
            0.95),
    # AWS secret access key, only where it is labelled (40 base64 chars are too common alone).
    Pattern("aws_secret_access_key",
            r"(?<=(?i:aws_?secret_?access_?key)[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9/+]{40}"
            r"(?![A-Za-z0-9/+])", 0.95),
    # GitHub classic tokens and fine-grained PATs.
    Pattern("github_token", r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])",
            0.95),
    Pattern("github_pat", r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,255}(?![A-Za-z0-9_])",
            0.95),
    # Slack tokens.
    Pattern("slack_token", r"(?<![A-Za-z0-9-])xox[abposr]-[A-Za-z0-9-]{10,}(?![A-Za-z0-9-])",
            0.9),
    # Google API keys.
    Pattern("google_api_key", r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])", 0.9),
    # JSON Web Tokens: header.payload.signature, header and payload are base64url JSON.
    Pattern("jwt", rf"(?<![.{_B64URL}])eyJ[{_B64URL}]{{5,}}\.eyJ[{_B64URL}]{{5,}}\."
            rf"[{_B64URL}]*(?![{_B64URL}])", 0.95),
    # The credential after an HTTP "Bearer" scheme (the word itself is kept).
    Pattern("bearer", r"(?<=(?<![A-Za-z])(?:Bearer|bearer|BEARER)[ \t]+)"
            r"[A-Za-z0-9._~+/-]{16,}=*(?![A-Za-z0-9._~+/=-])", 0.85),
    # PEM / OpenSSH / PGP private keys: the whole block...
    Pattern("private_key_block",
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----.*?"
            r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----", 1.0),
    # ...and a truncated one: the header plus the base64 lines that follow it (lower score,
    # so a complete block wins where both match).
    Pattern("private_key_truncated",
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"(?:(?:\r?\n|\\r|\\n|[ \t])+[A-Za-z0-9+/=]{16,})*", 0.99),
]

_STRONG_PREFIXES = ("-----BEGIN", "eyJ", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
                    "github_pat_", "AIza", "xox", "sk_live_", "sk_test_", "rk_live_", "rk_test_")
_HAS_DIGIT = std_re.compile(r"[0-9]")
_HAS_ALPHA = std_re.compile(r"[A-Za-z]")


class ApiSecretRecognizer(_FixedFlagsRecognizer):
    """API keys, access tokens, JWTs and private keys, matched case-sensitively."""

    PATTERNS = _SECRET_PATTERNS

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(API_SECRET, list(self.PATTERNS), supported_language,
                         name="ApiSecretRecognizer")

    def invalidate_result(self, pattern_text: str) -> bool:
        if pattern_text.startswith(_STRONG_PREFIXES):
            return False
        # What is left are the prefix-less shapes ("sk-...", a Bearer credential, a labelled
        # AWS secret). Random credentials mix letters and digits; prose such as
        # "sk-this-is-not-a-real-key-at-all" does not.
        body = pattern_text[3:] if pattern_text.startswith("sk-") else pattern_text
        return not (_HAS_DIGIT.search(body) and _HAS_ALPHA.search(body))


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


# (predicate on the digit string, allowed lengths)
_ISSUERS: list[tuple[Callable[[str], bool], frozenset[int]]] = [
    (lambda d: d[0] == "4", frozenset({13, 16, 19})),                                 # Visa
    (lambda d: _in(d[:2], 51, 55) or _in(d[:4], 2221, 2720), frozenset({16})),         # MC
    (lambda d: d[:2] in ("34", "37"), frozenset({15})),                                # Amex
    (lambda d: d[:4] == "6011" or d[:2] == "65" or _in(d[:3], 644, 649),
     frozenset({16, 17, 18, 19})),                                                     # Discover
    (lambda d: d[:2] == "62", frozenset({16, 17, 18, 19})),                            # UnionPay
    (lambda d: _in(d[:4], 3528, 3589), frozenset({16, 17, 18, 19})),                   # JCB
    (lambda d: _in(d[:3], 300, 305) or d[:2] in ("36", "38", "39"),
     frozenset({14, 16, 17, 18, 19})),                                                 # Diners
    (lambda d: d[:4] in ("5018", "5020", "5038", "5893", "6304", "6759", "6761", "6762", "6763"),
     frozenset({12, 13, 14, 15, 16, 17, 18, 19})),                                     # Maestro
    (lambda d: _in(d[:4], 2200, 2204), frozenset({16, 17, 18, 19})),                   # Mir
]


def is_plausible_card(value: str) -> bool:
    digits = "".join(c for c in value if c in "0123456789")
    if not 12 <= len(digits) <= 19 or len(set(digits)) < 2:
        return False
    if not any(pred(digits) and len(digits) in lengths for pred, lengths in _ISSUERS):
        return False
    return luhn_ok(digits)


class StrictCreditCardRecognizer(CreditCardRecognizer):
    """Card numbers of 12-19 digits (plain, or grouped by one consistent space/hyphen) that
    pass Luhn and match a known issuer prefix for their length."""

    PATTERNS = [
        Pattern(
            "card_grouped",
            r"(?<![0-9A-Za-z.,-])[2-6][0-9]{3}(?P<s>[ -])[0-9]{4,6}(?P=s)[0-9]{4,5}"
            r"(?:(?P=s)[0-9]{1,4})?(?:(?P=s)[0-9]{3})?(?![0-9A-Za-z]|[.,-][0-9])",
            0.3,
        ),
        Pattern(
            "card_plain",
            r"(?<![0-9A-Za-z.,-])[2-6][0-9]{11,18}(?![0-9A-Za-z]|[.,-][0-9])",
            0.3,
        ),
    ]

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(patterns=list(self.PATTERNS), supported_language=supported_language,
                         name="StrictCreditCardRecognizer")
        self.global_regex_flags = _FLAGS

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        result: list[RecognizerResult] = super().analyze(
            text, entities, nlp_artifacts, regex_flags=_FLAGS)
        return result

    def validate_result(self, pattern_text: str) -> bool:
        return is_plausible_card(pattern_text)


# --------------------------------------------------------------------------------------------
# Offline variants of presidio recognizers
# --------------------------------------------------------------------------------------------
_OFFLINE_TLD: tldextract.TLDExtract | None = None


def _offline_tld() -> tldextract.TLDExtract:
    """A suffix extractor that only uses tldextract's bundled snapshot: no download, no disk."""
    global _OFFLINE_TLD
    if _OFFLINE_TLD is None:
        _OFFLINE_TLD = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=(),
                                             fallback_to_snapshot=True)
    return _OFFLINE_TLD


class OfflineEmailRecognizer(EmailRecognizer):
    """presidio's email pattern, validated against the bundled public-suffix snapshot."""

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_language=supported_language, name="OfflineEmailRecognizer")

    def validate_result(self, pattern_text: str) -> bool:
        domain = pattern_text.rsplit("@", 1)[-1]
        return _offline_tld()(domain).fqdn != ""


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# Chinese text often glues the label to the address ("登录IP10.0.0.1"): allow a preceding "IP".
_AFTER_IP_LABEL = r"(?<=[Ii][Pp])"


class LabelAwareIpRecognizer(IpRecognizer):
    """presidio's IP recognizer with two changes: an address may directly follow the label
    "IP" (presidio needs a word boundary there), and an IPv4 address must not be part of a
    longer dotted number ("1.2.3.4.5", an OID or a five-part version)."""

    def __init__(self, supported_language: str = "en") -> None:
        patterns = []
        for p in IpRecognizer.PATTERNS:
            regex = p.regex
            if p.name == "IPv4":
                regex = (rf"(?:{_AFTER_IP_LABEL}|(?<![0-9A-Za-z_.]))(?:{_OCTET}\.){{3}}{_OCTET}"
                         r"(?:/(?:3[0-2]|[12]?[0-9]))?(?![0-9A-Za-z_]|\.[0-9])")
            elif regex.startswith(r"(?<![\w:])"):
                regex = rf"(?:{_AFTER_IP_LABEL}|(?<![\w:]))" + regex[len(r"(?<![\w:])"):]
            patterns.append(Pattern(p.name, regex, p.score))
        super().__init__(patterns=patterns, supported_language=supported_language,
                         name="LabelAwareIpRecognizer")


# --------------------------------------------------------------------------------------------
# Label vetoes: a few weak kinds are dropped when the text right before them names something
# that is not personal data ("版本号 1.2.0.4", "Order No. 2023111500", "运单号: 4001234567").
# Applied by the redactor to the ORIGINAL text (recognizers only see the analysis view, in
# which CJK characters are blanked).
# --------------------------------------------------------------------------------------------
_VERSION_LABEL = (r"v|ver|version|rev|revision|build|release|firmware|fw|sdk|"
                  r"版本|版本号|固件|内核")
_REFERENCE_LABEL = (r"order|tracking|invoice|sku|serial|batch|ticket|case|ref|reference|"
                    r"txn|transaction|po|awb|waybill|meeting|conference|webinar|room|"
                    r"会议|会议号|会议室|群号|房间号|"
                    r"订单|单号|订单号|运单|运单号|快递单号|物流单号|发票|发票号|流水号|交易号|"
                    r"编号|序列号|批次|批次号|工单|工单号|学号|工号|货号|型号")
_LABEL_TAIL = r"\s*(?:no\.?|number|num|id|#|号|号码|码)?\s*[:\uff1a#\uff03=]?\s*(?:是|为)?\s*$"
LABEL_VETOES: dict[str, std_re.Pattern[str]] = {
    "IP_ADDRESS": std_re.compile(rf"(?<![A-Za-z])(?:{_VERSION_LABEL})\.?{_LABEL_TAIL}",
                                 std_re.IGNORECASE),
    "PHONE_NUMBER": std_re.compile(rf"(?<![A-Za-z])(?:{_REFERENCE_LABEL}){_LABEL_TAIL}",
                                   std_re.IGNORECASE),
    "CN_MOBILE": std_re.compile(rf"(?<![A-Za-z])(?:{_REFERENCE_LABEL}){_LABEL_TAIL}",
                                std_re.IGNORECASE),
    "US_SSN": std_re.compile(rf"(?<![A-Za-z])(?:{_REFERENCE_LABEL}){_LABEL_TAIL}",
                             std_re.IGNORECASE),
}
_VETO_WINDOW = 24


def label_veto(kind: str, text: str, start: int) -> bool:
    """True when the entity of ``kind`` starting at ``start`` follows a non-PII label."""
    pattern = LABEL_VETOES.get(kind)
    if pattern is None:
        return False
    return pattern.search(text, max(0, start - _VETO_WINDOW), start) is not None


__all__ = [
    "API_SECRET",
    "CN_MOBILE",
    "CN_RESIDENT_ID",
    "ApiSecretRecognizer",
    "CnMobileRecognizer",
    "CnResidentIdRecognizer",
    "EntityRecognizer",
    "LabelAwareIpRecognizer",
    "OfflineEmailRecognizer",
    "StrictCreditCardRecognizer",
    "cn_id_check_char",
    "is_plausible_card",
    "is_valid_cn_resident_id",
    "label_veto",
    "luhn_ok",
]


# A cheap, conservative pre-filter: text in which none of these shapes occurs cannot match any
# built-in pattern recognizer, so presidio is not called for it (most chat turns). Every
# recognizer above needs one of: an "@", seven or more digits (separators allowed), a dotted
# quad or a hex:hex: IPv6 shape, a long alphanumeric run (keys, tokens, crypto addresses,
# IBANs) or a secret's label/prefix.
CANDIDATE_RE = std_re.compile(
    r"@"
    r"|\d(?:[\s\-.()/]{0,3}\d){6,}"
    r"|\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"
    r"|[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:"
    r"|[A-Za-z0-9_\-+/=]{20,}"
    r"|sk[-_]|rk_|AKIA|ASIA|gh[pousr]_|github_pat_|eyJ|BEGIN|xox[abprs]-|AIza"
    r"|(?i:bearer|secret|passw|api[_-]?key|token|aws)"
)
