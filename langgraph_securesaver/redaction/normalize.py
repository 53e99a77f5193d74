"""One spelling per value: the form a PII value is tokenized and looked up in.

Equal normalized values share a vault entry, so erasing any spelling of a value erases them
all (``forget_pii`` and ``forget_subject(identifiers=...)`` normalize what they are given the
same way). Phone numbers become E.164 (``+14155550142``) when ``phonenumbers`` accepts them
as a valid number of one of the configured regions -- ``415-555-0142``, ``1-415-555-0142``,
``001-415-555-0142`` and ``+1 (415) 555-0142`` are one number --; e-mails are case-folded
with their domain in IDNA (ASCII) form; card numbers, IBANs and national ids lose their
separators.

Pure functions of their inputs; no state.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Sequence

from .decoding import decode_text, drop_default_ignorables

#: regions whose national phone formats are recognized and normalized, in order of preference
DEFAULT_PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "CN")

_SEPARATED = ("CN_RESIDENT_ID", "CREDIT_CARD", "IBAN_CODE", "US_SSN")
_SEPARATORS = frozenset(" -./_\u00a0\u2010\u2011\u2012\u2013\u2014")


def normalize_value(kind: str, value: str,
                    regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> str:
    """The form of ``value`` that is tokenized: equal normalized values share a token."""
    v = _plain(value)
    if kind == "EMAIL_ADDRESS":
        return email(v)
    if kind == "PHONE_NUMBER":
        return phone(v, regions)
    if kind == "CN_MOBILE":
        digits = "".join(c for c in v if c.isdigit())
        return digits[-11:] if len(digits) > 11 else digits
    if kind in _SEPARATED:
        return "".join(c for c in v if c not in _SEPARATORS).upper()
    if kind == "IP_ADDRESS":
        try:
            return ipaddress.ip_interface(v).compressed
        except ValueError:
            return v.lower()
    return v


def _plain(value: str) -> str:
    """NFKC, escapes decoded, invisible characters dropped, other scripts' digits and dots
    as ASCII, surrounding space stripped."""
    v = unicodedata.normalize("NFKC", decode_text(value))
    if not v.isascii():
        v = drop_default_ignorables(v)
    if not v.isascii():  # the same value in other digits/dots gets the same token
        v = "".join(str(unicodedata.decimal(c)) if c.isdecimal() else
                    "." if c in "\u3002\uff61" else c for c in v
                    if unicodedata.category(c) != "Cf")
    return v.strip()


def email(v: str) -> str:
    """Case-folded, ``mailto:`` dropped, the domain in IDNA ASCII form (``bücher.de`` and
    ``xn--bcher-kva.de`` are one domain)."""
    v = v.casefold()
    if v.startswith("mailto:"):
        v = v[len("mailto:"):]
    local, at, domain = v.rpartition("@")
    if not at:
        return v
    labels = []
    for label in domain.rstrip(".").split("."):
        if not label.isascii():
            try:
                label = label.encode("idna").decode("ascii")
            except UnicodeError:
                pass
        labels.append(label)
    return f"{local}@{'.'.join(labels)}"


def phone(v: str, regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> str:
    """E.164 when ``phonenumbers`` reads ``v`` as a valid number (international, or national
    in the first of ``regions`` where it is valid); else its digits (with ``+`` if given)."""
    import phonenumbers

    text = "+" + v[2:] if v.startswith("00") else v
    for region in (None,) if text.startswith("+") else tuple(regions):
        try:
            number = phonenumbers.parse(text, region.upper() if region else None)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return str(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164))
    digits = "".join(c for c in v if c.isdigit())
    return ("+" if text.startswith("+") else "") + digits
