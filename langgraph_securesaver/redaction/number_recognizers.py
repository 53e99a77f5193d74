"""Recognizers of checksummed numbers and addresses: US social security numbers, payment
cards (issuer table + Luhn) and IP addresses (label-aware).

Each is a :class:`~.linear.LinearRecognizer`; knows nothing of the redactor.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from .linear import LinearRecognizer, Validator, rx

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
                           "6762", "6763", "6220", "0604"})
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
NOT_CARDS = frozenset({"2147483647", "4294967295", "9223372036854775807"})


def is_plausible_card(value: str) -> bool:
    digits = "".join(c for c in value if c in "0123456789")
    if not 12 <= len(digits) <= 19 or len(set(digits)) < 2 or digits in NOT_CARDS:
        return False
    if not any(pred(digits) and len(digits) in lengths for pred, lengths in _ISSUERS):
        return False
    return luhn_ok(digits)


IBAN_HEAD = re.compile(r"[A-Z]{2}[0-9]{2}[ \-]?(?:[A-Z0-9]{4}[ \-]?)*$")


def _validate_card(m: re.Match[str], view: str) -> float | None:
    if not is_plausible_card(m.group(0)):
        return None
    if IBAN_HEAD.search(view, max(0, m.start() - 40), m.start()):
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
           _START + r"(?:[1-8][0-9]{3}|0604)(?P<s>[ .\-])[0-9]{4,6}(?P=s)[0-9]{4,5}"
           r"(?:(?P=s)[0-9]{1,4})?(?:(?P=s)[0-9]{3})?" + _END, 1.0, _validate_card),
        rx("card_plain", _START + r"(?:[1-8][0-9]{3}|0604)[0-9]{8,15}" + _END, 1.0,
           _validate_card),
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


def _validate_ip_plus_one(m: re.Match[str], view: str) -> float | None:
    if len(m.group(0).split(".", 1)[0]) < 2:
        return None  # "4.9.56.47.33": an OID or a version more likely than a host
    return _validate_ip(m, view)


class LabelAwareIpRecognizer(LinearRecognizer):
    """IPv4 (not part of a longer dotted number), IPv6 and IPv4-mapped IPv6 addresses; an
    address may directly follow the label "IP"."""

    ENTITY = "IP_ADDRESS"
    PATTERNS = (
        rx("ipv4", r"(?:(?<=[Ii][Pp])|(?<![0-9A-Za-z_.]))" + _IPV4
           + r"(?:/(?:3[0-2]|[12]?[0-9]))?(?![0-9A-Za-z_]|\.[0-9])",
           0.6, _validate_ip, needles=(".",)),
        # "192.168.1.1.1": an address and one more group (a port or a typo), not a longer
        # dotted number (OIDs, versions: three or more groups beyond, or an octet > 255)
        rx("ipv4_plus_one", r"(?:(?<=[Ii][Pp])|(?<![0-9A-Za-z_.]))" + _IPV4
           + r"(?=\.[0-9]{1,3}(?![0-9A-Za-z_]|\.[0-9]))", 0.6, _validate_ip_plus_one,
           needles=(".",)),
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
