"""National identity and tax numbers of ten countries, and IBANs written in lower case.

Each kind is matched by a linear-time pattern and kept only when its check digit (or letter)
is right where the format has one: UK NINO (no check: its letter rules), FR NIR (mod 97),
IT codice fiscale (check letter), BR CPF (two mod-11 digits), KR RRN (mod 11), IN Aadhaar
(Verhoeff) and PAN (no check: its holder-type letter), PL PESEL (weighted mod 10), ES DNI/NIE
(mod-23 letter), NL BSN (11-proof), DE Steuer-ID (ISO 7064 MOD 11,10). Formats that are
just digits (PESEL, BSN, Steuer-ID, a CPF without its punctuation) also need their name
within 40 characters before them ("PESEL:", "BSN", "Steuer-ID"...): a checksum alone passes
one random number in ten. After its name, a value of the right shape is claimed without its
check (an RRN issued since 2020 has none; placeholder NINOs such as "ZZ 53 00 05 T";
an Aadhaar written by hand). Knows nothing of the redactor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from presidio_analyzer import EntityRecognizer, RecognizerResult

from .windows import window_start

_LABEL_NEAR = 40
_NOT_BEFORE = r"(?<![0-9A-Za-z])"
_NOT_AFTER = r"(?![0-9A-Za-z])"


def _digits(value: str) -> list[int]:
    return [int(c) for c in value if c.isdigit()]


def _nino(value: str) -> bool:
    return value[:2] not in ("BG", "GB", "NK", "KN", "TN", "NT", "ZZ")


def _nir(value: str) -> bool:
    v = re.sub(r"[ .]", "", value).upper()
    body, key = v[:13], int(v[13:])
    body = body.replace("2A", "19").replace("2B", "18") if body[5:7] in ("2A", "2B") else body
    return body.isdigit() and 97 - int(body) % 97 == key


_CF_ODD = dict(zip("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                   [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4,
                    18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23], strict=True))


def _cf_even(c: str) -> int:
    return int(c) if c.isdigit() else ord(c) - 65


def _codice_fiscale(value: str) -> bool:
    v = value.upper()
    total = sum(_CF_ODD[c] if i % 2 == 0 else _cf_even(c) for i, c in enumerate(v[:15]))
    return chr(65 + total % 26) == v[15]


def _cpf(value: str) -> bool:
    d = _digits(value)
    if len(d) != 11 or len(set(d)) == 1:
        return False
    first = sum(d[i] * (10 - i) for i in range(9)) * 10 % 11 % 10
    second = sum(d[i] * (11 - i) for i in range(10)) * 10 % 11 % 10
    return d[9] == first and d[10] == second


def _rrn(value: str) -> bool:
    d = _digits(value)
    weights = (2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5)
    return (11 - sum(a * b for a, b in zip(d[:12], weights, strict=True)) % 11) % 10 == d[12]


_VERHOEFF_D = ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 0, 6, 7, 8, 9, 5),
               (2, 3, 4, 0, 1, 7, 8, 9, 5, 6), (3, 4, 0, 1, 2, 8, 9, 5, 6, 7),
               (4, 0, 1, 2, 3, 9, 5, 6, 7, 8), (5, 9, 8, 7, 6, 0, 4, 3, 2, 1),
               (6, 5, 9, 8, 7, 1, 0, 4, 3, 2), (7, 6, 5, 9, 8, 2, 1, 0, 4, 3),
               (8, 7, 6, 5, 9, 3, 2, 1, 0, 4), (9, 8, 7, 6, 5, 4, 3, 2, 1, 0))
_VERHOEFF_P = ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 5, 7, 6, 2, 8, 3, 0, 9, 4),
               (5, 8, 0, 3, 7, 9, 6, 1, 4, 2), (8, 9, 1, 6, 0, 4, 3, 5, 2, 7),
               (9, 4, 5, 3, 1, 2, 6, 8, 7, 0), (4, 2, 8, 6, 5, 7, 3, 9, 0, 1),
               (2, 7, 9, 3, 8, 0, 6, 4, 1, 5), (7, 0, 4, 6, 9, 1, 3, 2, 5, 8))


def _aadhaar(value: str) -> bool:
    c = 0
    for i, digit in enumerate(reversed(_digits(value))):
        c = _VERHOEFF_D[c][_VERHOEFF_P[i % 8][digit]]
    return c == 0


def _pesel(value: str) -> bool:
    d = _digits(value)
    month = (d[2] * 10 + d[3]) % 20
    if not 1 <= month <= 12 or not 1 <= d[4] * 10 + d[5] <= 31:
        return False
    weights = (1, 3, 7, 9, 1, 3, 7, 9, 1, 3)
    return (10 - sum(a * b for a, b in zip(d[:10], weights, strict=True)) % 10) % 10 == d[10]


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def _dni(value: str) -> bool:
    v = value.upper().replace("-", "").replace(" ", "")
    head = {"X": "0", "Y": "1", "Z": "2"}.get(v[0], v[0]) + v[1:-1]
    return head.isdigit() and _DNI_LETTERS[int(head) % 23] == v[-1]


def _bsn(value: str) -> bool:
    d = _digits(value)
    return len(d) == 9 and (sum(d[i] * (9 - i) for i in range(8)) - d[8]) % 11 == 0 and any(d)


def _steuer_id(value: str) -> bool:
    d = _digits(value)
    if len(d) != 11 or d[0] == 0:
        return False
    counts = sorted((d[:10].count(x) for x in set(d[:10])), reverse=True)
    if counts[0] not in (2, 3) or counts[1:2] == [counts[0]]:
        return False  # exactly one digit of the first ten appears twice or three times
    product = 10
    for digit in d[:10]:
        total = (digit + product) % 10 or 10
        product = total * 2 % 11
    return (11 - product) % 10 == d[10]


# IBAN length per country: the ISO 13616 registry (SWIFT, release 99), then the countries that
# issue IBANs outside it (West and Central Africa, Algeria, Iran, ...). presidio's per-country
# formats get some lengths wrong (PT, PS, QA, MU) and lack others (RU, SV, NI, ...).
_IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
    "AO": 25, "BF": 28, "BJ": 28, "CF": 27, "CG": 27, "CI": 28, "CM": 27, "CV": 25, "DZ": 26,
    "GA": 27, "GQ": 27, "GW": 25, "IR": 26, "KM": 27, "MA": 28, "MG": 27, "ML": 28, "MZ": 25,
    "NE": 28, "SN": 28, "TD": 27, "TG": 28,
}


def _iban(value: str) -> bool:
    """A lower-case IBAN counts only with its country's length and a right checksum (a random
    hex id such as a UUID passes the checksum alone about once in a thousand; no country's
    IBAN has a UUID's 32 hex digits)."""
    v = value.replace(" ", "").upper()
    if _IBAN_LENGTHS.get(v[:2]) != len(v):
        return False
    moved = v[4:] + v[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


# (kind, pattern, validator, label the value needs before it or None)
_Spec = tuple[str, "re.Pattern[str]", Callable[[str], bool], "re.Pattern[str] | None"]


def _label(words: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z])(?:{words})(?![a-z])", re.IGNORECASE)


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(_NOT_BEFORE + "(?:" + pattern + ")" + _NOT_AFTER, re.ASCII)


def _any(_value: str) -> bool:
    return True


_NINO_LABEL = _label("national insurance|nino|ni (?:number|no)")
_RRN_LABEL = _label("rrn|resident registration")  # (the view blanks Hangul)
_AADHAAR_LABEL = _label("aadhaar|aadhar|uidai|uid")

_SPECS: tuple[_Spec, ...] = (
    ("UK_NINO", _p(r"[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-D]"),
     _nino, None),
    # placeholder and administrative forms ("ZZ 53 00 05 T"), after their name only
    ("UK_NINO", _p(r"[A-Z]{2} ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-Z]"), _any, _NINO_LABEL),
    ("FR_NIR", _p(r"[12378] ?[0-9]{2} ?(?:0[1-9]|1[0-2]|[2-9][0-9]) ?(?:[0-9]{2}|2[ABab]) ?"
                  r"[0-9]{3} ?[0-9]{3} ?[0-9]{2}"), _nir, None),
    ("IT_FISCAL_CODE", _p(r"[A-Z]{6}[0-9LMNPQRSTUV]{2}[ABCDEHLMPRST][0-9LMNPQRSTUV]{2}[A-Z]"
                          r"[0-9LMNPQRSTUV]{3}[A-Z]"), _codice_fiscale, None),
    ("BR_CPF", _p(r"[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}"), _cpf, None),
    ("BR_CPF", _p(r"[0-9]{11}"), _cpf, _label("cpf")),
    ("KR_RRN", _p(r"[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])-[1-8][0-9]{6}"), _rrn,
     None),
    # numbers issued since 2020 carry no check digit: written with the dash, a birth date and
    # the century/sex digit are the shape (a month or day of 00 too: an unknown birth date
    # is registered so, and a mistyped number is still someone's); without the dash, after
    # their name
    ("KR_RRN", _p(r"[0-9]{2}(?:0[0-9]|1[0-2])(?:[0-2][0-9]|3[01])-[1-8][0-9]{6}"), _any,
     None),
    ("KR_RRN", _p(r"[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])[1-8][0-9]{6}"), _any,
     _RRN_LABEL),
    ("IN_AADHAAR", _p(r"[2-9][0-9]{3}([ \-])[0-9]{4}\1[0-9]{4}"), _aadhaar, None),
    ("IN_AADHAAR", _p(r"[0-9]{4}([ \-]?)[0-9]{4}\1[0-9]{4}"), _any, _AADHAAR_LABEL),
    ("IN_PAN", _p(r"[A-Z]{3}[ABCFGHJLPT][A-Z][0-9]{4}[A-Z]"), lambda _v: True, None),
    ("PL_PESEL", _p(r"[0-9]{11}"), _pesel, _label("pesel")),
    ("ES_NIF", _p(r"[0-9]{8}-?[A-Z]"), _dni, None),
    ("ES_NIE", _p(r"[XYZ]-?[0-9]{7}-?[A-Z]"), _dni, None),
    ("NL_BSN", _p(r"[0-9]{9}|[0-9]{4}\.[0-9]{2}\.[0-9]{3}"), _bsn,
     _label("bsn|burgerservicenummer|sofinummer|sofi")),
    ("DE_TAX_ID", _p(r"[1-9][0-9](?: ?[0-9]{3}){3}"), _steuer_id,
     _label("steuer[- ]?id|steuerid|steuer-?identifikationsnummer|identifikationsnummer|"
            "idnr|tax id|tin|steuernummer")),
    ("IBAN_CODE", _p(r"[a-z]{2}[0-9]{2}(?: ?[a-z0-9]{4}){2,7}(?: ?[a-z0-9]{1,4})?"), _iban,
     None),
)
NATIONAL_ID_KINDS: tuple[str, ...] = tuple(sorted({s[0] for s in _SPECS} - {"IBAN_CODE"}))


class NationalIdRecognizer(EntityRecognizer):
    """The kinds of :data:`NATIONAL_ID_KINDS`, and lower-case IBANs (see the module doc)."""

    SCORE = 1.0  # a checksum or its name: above a phone's 0.4 and beside a card's 1.0

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=[*NATIONAL_ID_KINDS, "IBAN_CODE"],
                         name=type(self).__name__, supported_language=supported_language)

    def load(self) -> None:
        return None

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        results: list[RecognizerResult] = []
        for kind, pattern, valid, label in _SPECS:
            if entities and kind not in entities:
                continue
            for m in pattern.finditer(text):
                if not valid(m.group(0)):
                    continue
                if label is not None:
                    lo = window_start(text, max(0, m.start() - _LABEL_NEAR), m.start())
                    if label.search(text, lo, m.start()) is None:
                        continue
                results.append(RecognizerResult(kind, m.start(), m.end(), self.SCORE))
        return results
