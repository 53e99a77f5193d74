"""The analysis view of a text: compatibility forms folded to ASCII, CJK and other scripts
blanked, the redactor's own markers blanked, with an exact map from view offsets back to the
original; plus the cheap pre-checks (may this hold PII, is this JSON, is this a data URL).

Pure functions of their inputs; the recognizers only ever see this view.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from .decoding import DECODABLE, is_default_ignorable
from .recognizers import API_SECRET, CANDIDATE_RE

# --------------------------------------------------------------------------------------------
# Analysis view: compatibility forms folded to ASCII, CJK blanked, known markers blanked, with
# an exact map from view offsets back to the original text
# --------------------------------------------------------------------------------------------
_CJK_RE = re.compile(
    "["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi
    "\u2ff0-\u2fff\u3001\u3003-\u303f"  # ideographic description, CJK symbols (not U+3000/3002)
    "\u3040-\u31ff"  # kana, bopomofo, Hangul compatibility, CJK strokes
    "\u3200-\u4dbf"  # enclosed CJK, CJK compatibility, extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f"
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\ufe30-\ufe4f"  # CJK compatibility forms
    "\U00020000-\U0003134f"  # CJK extensions B-G
    "]"
)
# The blank is NUL: not a word character (so \b works), not whitespace and not phone-number
# punctuation (so "2023年11月15日" does not turn into the digit groups "2023 11 15").
BLANK = "\x00"
_IDEO_STOP = "\u3002"  # 。 (and ｡): a dot between ASCII letters/digits (e-mail, domain), else blank
_IDEO_DOT = re.compile(r"(?<=[A-Za-z0-9])\u3002(?=[A-Za-z0-9])")
_EXTRA_DASHES = frozenset("\u2212\u2043\ufe63\uff0d\u02d7\u2796")


def _fold_char(ch: str) -> str:
    """The analysis form of one non-ASCII character: '' (dropped), one or more ASCII
    characters, or the blank."""
    if ch in "\u3002\uff61":
        return _IDEO_STOP
    if is_default_ignorable(ch):
        return ""  # invisible: zero-width and bidi controls, Hangul fillers, variation selectors
    if _CJK_RE.match(ch):
        return BLANK
    cat = unicodedata.category(ch)
    if cat == "Nd":
        return str(unicodedata.decimal(ch, 0))
    if cat == "Zs" or ch in "\u2028\u2029\x85":
        return " "
    if cat == "Pd" or ch in _EXTRA_DASHES:
        return "-"
    if cat in ("Cf", "Mn", "Me"):
        return ""  # zero-width and bidi controls, soft hyphen, combining marks
    folded = unicodedata.normalize("NFKC", ch)
    if folded.isascii() and folded:
        return folded
    base = unicodedata.normalize("NFKD", ch)[:1]
    if base.isascii() and base.isalpha():
        return base  # é -> e
    return BLANK


class _FoldTable(dict[int, str]):
    """``str.translate`` table built on demand; records characters that change length."""

    def __init__(self) -> None:
        super().__init__((i, chr(i)) for i in range(128))
        self.non_unit: set[int] = set()

    def __missing__(self, cp: int) -> str:
        folded = _fold_char(chr(cp))
        if len(folded) != 1:
            self.non_unit.add(cp)
        self[cp] = folded
        return folded


_FOLD = _FoldTable()
_SLICE = 65_536


def fold_text(text: str) -> tuple[str, list[int] | None]:
    """(folded text, offsets): ``offsets[i]`` is the index in ``text`` of the character that
    produced folded character ``i`` (plus a final ``len(text)``), or None when every
    character folded to exactly one (offsets are then the identity)."""
    if text.isascii():
        return text, None
    if len(text) <= _SLICE:
        view = text.translate(_FOLD)
    else:  # slices: no single C call holds the GIL for long (async callers' event loop)
        view = "".join(text[i:i + _SLICE].translate(_FOLD) for i in range(0, len(text), _SLICE))
    if _IDEO_STOP in view:
        view = _IDEO_DOT.sub(".", view).replace(_IDEO_STOP, BLANK)
    non_unit = _FOLD.non_unit
    if len(view) == len(text) and (not non_unit or not any(
            not non_unit.isdisjoint(map(ord, set(text[i:i + _SLICE])))
            for i in range(0, len(text), _SLICE))):
        return view, None
    offsets: list[int] = []
    table = _FOLD
    for i, ch in enumerate(text):
        n = len(table[ord(ch)])
        if n == 1:
            offsets.append(i)
        elif n:
            offsets.extend([i] * n)
    offsets.append(len(text))
    return view, offsets


def map_span(offsets: list[int] | None, start: int, end: int) -> tuple[int, int]:
    if offsets is None:
        return start, end
    if end <= start:
        return offsets[start], offsets[start]
    return offsets[start], offsets[end - 1] + 1


MARKER_RE = re.compile(r"<([A-Z][A-Z0-9_]{0,63}):(?:[0-9a-f]{32}|masked)>")
# Labels of markers the redactor itself writes besides entity kinds.
WITHHELD = "WITHHELD"
EMBEDDED_PII = "EMBEDDED_PII"
OWN_LABELS = frozenset({WITHHELD, EMBEDDED_PII, "PII"})


def blank_markers(view: str, labels: frozenset[str] | None) -> str:
    """Blank the tokens and masks of known kinds (never analyzed again). A marker-shaped
    string with any other label is analyzed like any text (``<AKIA…:masked>`` is a key)."""
    if "<" not in view:
        return view

    def blank(m: re.Match[str]) -> str:
        if labels is None or m.group(1) in labels:
            return BLANK * len(m.group(0))
        return m.group(0)

    return MARKER_RE.sub(blank, view)


def analysis_view(text: str, labels: frozenset[str] | None = None) -> str:
    """The text the recognizers see (see :func:`fold_text`), markers of ``labels`` blanked
    (every marker when ``labels`` is None)."""
    return blank_markers(fold_text(text)[0], labels)


# A data URL's base64 payload: decoded and analyzed as text (when it is text), never as
# base64 gibberish; what follows it is analyzed as usual.
DATA_URL = re.compile(
    r"data:[A-Za-z0-9.+\-]{1,64}/[A-Za-z0-9.+\-]{1,64}(?:;[A-Za-z0-9.+\-=]{1,64}){0,4};base64,"
    r"(?P<p>[A-Za-z0-9+/_\-]{16,}={0,2})(?=[\s\"'`)>\],;}\x00]|$)", re.ASCII)
_DATA_URL_DECODE_MAX = 4_000_000


def decode_payload(payload: str) -> str | None:
    """The payload as text, or None if it is not base64 of UTF-8 text."""
    import base64
    import binascii

    if len(payload) > _DATA_URL_DECODE_MAX:
        return None
    raw = payload.replace("-", "+").replace("_", "/")
    raw += "=" * (-len(raw) % 4)
    try:
        data = base64.b64decode(raw, validate=True)
        text = data.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if not text or sum(1 for c in text[:4096] if c.isprintable() or c in "\t\r\n") < 0.9 * min(
            len(text), 4096):
        return None
    return text


#: short strings :func:`may_have_pii` found nothing in (dictionary keys, labels, enum-like
#: values repeat from write to write: each is scanned once). Text nothing can match is all
#: this holds, so no PII is kept by it; bounded in count and length.
_CLEAN: dict[str, None] = {}
_CLEAN_MAX = 8192
_CLEAN_MAX_CHARS = 256


def may_have_pii(s: str) -> bool:
    """False only for text in which no built-in recognizer can match (cheap, conservative):
    non-ASCII text always goes to the analysis view and its own pre-filter."""
    if type(s) is str and s in _CLEAN:
        return False
    if len(s) > _SLICE:
        return True  # long text is pre-filtered chunk by chunk in _raw_detect
    if (not s.isascii() or CANDIDATE_RE.search(s) is not None
            or DECODABLE.search(s) is not None):
        return True
    if len(s) <= _CLEAN_MAX_CHARS and len(_CLEAN) < _CLEAN_MAX:
        _CLEAN[s] = None
    return False


SECRET_OVERLAP = 4096
# BATCH_SEP (the joint of a batch of strings) lives in .windows with the window bounds.


# Tie-breakers when detections overlap: higher score, then longer span, then this priority.
PRIORITY = {API_SECRET: 9, "CN_RESIDENT_ID": 8, "CREDIT_CARD": 7, "IBAN_CODE": 7,
            "EMAIL_ADDRESS": 6, "CN_MOBILE": 6, "US_SSN": 5, "IP_ADDRESS": 5, "CRYPTO": 5,
            "PHONE_NUMBER": 3,
            # national IDs (checksummed, or after their name): over a card of the same digits
            **dict.fromkeys(("BR_CPF", "DE_TAX_ID", "ES_NIE", "ES_NIF", "FR_NIR", "IN_AADHAAR",
                             "IN_PAN", "IT_FISCAL_CODE", "KR_RRN", "NL_BSN", "PL_PESEL",
                             "UK_NINO"), 8)}


_JSON_WS = " \t\r\n"


def looks_like_json(s: str) -> bool:
    if len(s) < 2:
        return False
    head, tail = s[0], s[-1]
    if head in _JSON_WS or tail in _JSON_WS:
        head, tail = s.lstrip()[:1], s.rstrip()[-1:]
    return (head == "{" and tail == "}") or (head == "[" and tail == "]")


def dump_like(original: str, value: Any) -> str:
    """Serialize ``value`` in roughly the style of ``original``."""
    ensure_ascii = original.isascii() and "\\u" in original
    if "\n" in original.strip():
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=2)
    if ": " in original or ", " in original:
        return json.dumps(value, ensure_ascii=ensure_ascii)
    return json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"))
