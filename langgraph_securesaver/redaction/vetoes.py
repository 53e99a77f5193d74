"""Label vetoes: weak kinds dropped when the original text names something that is not
personal data right before them (a version, an order number) or glues the number to an
identifier. Applied by the redactor (:func:`label_veto`); patterns and a window only.
"""

from __future__ import annotations

import re

from .decoding import decode_text
from .number_recognizers import IBAN_HEAD, NOT_CARDS
from .windows import window_start

# --------------------------------------------------------------------------------------------
# Label vetoes: a few weak kinds are dropped when the text right before them names something
# that is not personal data ("版本号 1.2.0.4", "Order No. 2023111500", "运单号: 4001234567"),
# or when the number is glued to an identifier ("INV-2723916661", "uid=12894277801").
# Applied by the redactor to the original text.
# --------------------------------------------------------------------------------------------
_VERSION_LABEL = (r"v|rv|ver|version|rev|revision|build|release|firmware|fw|sdk|section|sec|oid|"
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
_GLUED_ID = re.compile(r"(?:[A-Za-z][A-Za-z0-9_]*[\-_#/=:\[]|[A-Za-z_][A-Za-z0-9_]*\s{0,2}=\s{0,2}|"
                       r"[0-9][._:])$")  # "30546354_2879516879", "00:07:42.587 25746"
# a host name goes on after the number: "211-76-104-65.ebix.net.tw" is a host, not a phone
_HOST_AFTER = re.compile(r"\.[A-Za-z][A-Za-z0-9\-]{0,62}\.[A-Za-z]")
_PHONE_KEY = re.compile(r"(?:(?:phone|tel|mobile|cell|fax|call|contact|whatsapp|sms|ssn|card|"
                        r"cc|pan)[A-Za-z0-9_]*|(?<![A-Za-z0-9_])(?:to|from|number|msisdn|"
                        r"callee|recipient))[\s\"']{0,2}[\-_#/=:\[]\s{0,2}$", re.IGNORECASE)
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
_KEY_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\s{0,2}[=:]\s{0,2}$")
_FORMATTED = re.compile(r"[+()]|[0-9][ .\-]+[0-9]")
_PHONE_KINDS = frozenset({"PHONE_NUMBER", "CN_MOBILE"})
_GLUED_KINDS = frozenset({"PHONE_NUMBER", "CN_MOBILE", "US_SSN", "CREDIT_CARD"})
_AFTER_VETO = re.compile(r"\s{0,2}(?:\u7248\u672c|\u7248|version|release)", re.IGNORECASE)
_VETO_WINDOW = 24


def label_veto(kind: str, text: str, start: int, end: int | None = None) -> bool:
    """True when the entity of ``kind`` at ``start``/``end`` follows a non-PII label, is glued
    to an identifier, or (IP addresses) is followed by a version label."""
    pattern = LABEL_VETOES.get(kind)
    if pattern is None:
        return False
    lo = window_start(text, max(0, start - _VETO_WINDOW), start)
    if pattern.search(text, lo, start) is not None:
        return True
    if kind in _PHONE_KINDS and end is not None and _HOST_AFTER.match(text, end):
        return True
    if end is not None and kind in _GLUED_KINDS:
        if "".join(c for c in text[start:end] if c.isdigit()) in NOT_CARDS:
            return True  # 2147483647 and friends
        if IBAN_HEAD.search(text, window_start(text, max(0, start - 40), start), start):
            return True  # digits inside an IBAN
    if kind in _GLUED_KINDS and _GLUED_ID.search(text, lo, start) is not None:
        if _PHONE_KEY.search(text, lo, start) is not None:
            return False
        # "to=+86-167-3376-0814", "number=001-875-439-1887": a formatted number as the value
        # of a key in a log line; a plain digit run after a key ("uid=12894277801") stays out
        return not (kind != "CREDIT_CARD" and _KEY_VALUE.search(text, lo, start) is not None
                    and end is not None and _FORMATTED.search(decode_text(text[start:end])))
    if kind == "IP_ADDRESS" and end is not None and _AFTER_VETO.match(text, end):
        return True
    return False
