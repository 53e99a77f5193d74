"""Characters that steer a terminal or reorder text, refused in ids and escaped on output.

An id is printed to operators (``securesaver events``, ``audit``, ``scan``, error lines), so
a character that a terminal executes or that reorders what a reader sees lets whoever chose
the id write on the operator's screen: clear it, set the window title, hide the rest of the
line, make ``acme`` read as ``emca``. The set, :data:`CONTROL_CHARS`:

* **C0 controls** U+0000-U+001F (ESC starts ANSI/OSC sequences; also CR, LF, TAB, BEL,
  backspace), **DEL** U+007F and **C1 controls** U+0080-U+009F (CSI, OSC, NEL as single
  characters);
* **bidirectional controls**: the embeddings and overrides U+202A-U+202E, the isolates
  U+2066-U+2069, and the marks U+200E, U+200F, U+061C;
* the **line and paragraph separators** U+2028, U+2029.

Invisible characters are refused too (:func:`invisible_at`): ``acme`` and ``ac<U+2060>me`` would
be two tenants that every terminal, log viewer and report shows alike. The set is the Unicode
property **Default_Ignorable_Code_Point** (read from the character database of the ``regex``
module, not a hand list): zero-width space U+200B, word joiner U+2060, the invisible operators
U+2061-U+2064, BOM U+FEFF, soft hyphen U+00AD, combining grapheme joiner U+034F, Mongolian
vowel separator U+180E, the Hangul fillers U+115F, U+1160, U+3164, U+FFA0, variation
selectors, tag characters U+E0000-U+E0FFF, and the joiners U+200C/U+200D -- except where one of
them changes what is shown, the contexts scripts and emoji need:

* ZWNJ U+200C or ZWJ U+200D right after a virama (Devanagari and other Indic conjuncts), and
  ZWNJ between two letters that would otherwise join (Persian, Arabic, Syriac, N'Ko): the
  CONTEXTJ rules of IDNA (RFC 5892, appendix A.1 and A.2);
* ZWJ between two pictographs of an emoji ZWJ sequence (woman, ZWJ, laptop; a skin-tone
  modifier or U+FE0F may follow the first);
* the variation selectors U+FE0E/U+FE0F right after a pictograph, and U+FE0F in a keycap
  (a digit, ``#`` or ``*``, then U+FE0F and U+20E3).

Not refused: look-alike letters of other scripts (Cyrillic U+0430 for Latin ``a``) and
trailing or unusual spaces; they are visible characters, shown as they are.

Everything else is allowed: letters of every script (CJK, Arabic, Hebrew, ...), digits,
punctuation, spaces inside an id, and emoji.

:func:`validate_id_text` refuses such characters in ids at the API (tenant ids, thread ids,
checkpoint namespaces, actors); :func:`escape_controls` shows each one (controls and refused
invisibles) as ``\\xNN`` / ``\\uNNNN`` for values that reach a terminal anyway (rows
written before the check, or by someone who writes the database directly), and
:func:`json_safe` does the same inside JSON text (``\\u00NN``).
"""

from __future__ import annotations

import re
from functools import cache
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING

from .errors import ConfigurationError

#: the code points refused in ids and escaped on output (see the module doc)
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
CONTROL_CHARS = "\x00-\x1f" + _BEYOND_C0
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")
# in JSON text a raw line feed is the indentation's, never a string's (json.dumps escapes C0)
_CONTROL_IN_JSON = re.compile(f"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")


# Where a default-ignorable character is shown (changes the rendering), see the module doc.
_SHOWN_IGNORABLE = (
    r"(?<=\p{Canonical_Combining_Class=Virama})[\u200c\u200d]"
    r"|(?<=[\p{Joining_Type=Dual_Joining}\p{Joining_Type=Left_Joining}]"
    r"\p{Joining_Type=Transparent}*)\u200c"
    r"(?=\p{Joining_Type=Transparent}*[\p{Joining_Type=Dual_Joining}"
    r"\p{Joining_Type=Right_Joining}])"
    r"|(?<=\p{Extended_Pictographic}[\p{Emoji_Modifier}\ufe0f]?)\u200d"
    r"(?=\p{Extended_Pictographic})"
    r"|(?<=\p{Extended_Pictographic})[\ufe0e\ufe0f]"
    r"|(?<=[0-9#*])\ufe0f(?=\u20e3)")

if TYPE_CHECKING:
    import regex


@cache
def _invisible() -> regex.Pattern[str]:
    """The refused invisible characters (compiled on the first text that is not ASCII: ASCII
    holds none, and a command that prints only ASCII ids does not import ``regex``)."""
    import regex
    return regex.compile(rf"(?!{_SHOWN_IGNORABLE})\p{{Default_Ignorable_Code_Point}}",
                         regex.VERSION1)


def has_controls(text: str) -> bool:
    return _CONTROL.search(text) is not None


def invisible_at(text: str) -> int | None:
    """The position of the first refused invisible character of ``text`` (see the module
    doc), or None. ASCII holds none."""
    if text.isascii():
        return None
    found = _invisible().search(text)
    return None if found is None else found.start()


def validate_id_text(text: str, what: str) -> str:
    """``text`` unchanged, or :class:`ConfigurationError` naming the first control or
    invisible character (by code point: the message is printed too)."""
    found = _CONTROL.search(text)
    if found is not None:
        raise ConfigurationError(
            f"{what} holds the control character U+{ord(found.group()):04X} at position "
            f"{found.start()}; ids may not hold C0/C1 controls, DEL, bidirectional controls "
            "or line separators (they would steer the terminal of whoever reads them)")
    at = invisible_at(text)
    if at is not None:
        raise ConfigurationError(
            f"{what} holds the invisible character U+{ord(text[at]):04X} at position {at}; "
            "ids may not hold Default_Ignorable_Code_Point characters (zero-width spaces and "
            "joiners, BOM, fillers, tag characters, ...) outside the script and emoji "
            "sequences that show them (two ids would print alike)")
    return text


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
            else f"\\U{code:08x}")


def escape_controls(text: str) -> str:
    """``text`` with every control character and refused invisible character shown as
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if _CONTROL.search(text):
        text = _CONTROL.sub(_escaped, text)
    if invisible_at(text) is not None:
        text = _invisible().sub(_escaped, text)
    return text


def escape_invisibles(text: str) -> str:
    """``text`` with every refused invisible character shown as ``\\uNNNN`` (for output that
    has its own escaping of controls, e.g. HTML)."""
    return _invisible().sub(_escaped, text) if invisible_at(text) is not None else text


def _json_escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000   # JSON writes a character beyond the BMP as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_safe(text: str) -> str:
    """JSON text (from ``json.dumps``) with every control character and refused invisible
    character still raw in it written ``\\uNNNN``; line feeds of the indentation stay.

    ``json.dumps`` already escapes C0 in strings (and, with ``ensure_ascii``, everything else
    but DEL); with ``ensure_ascii=False`` C1 controls, bidi controls and separators stay raw.
    Those can only stand inside string literals, where the escape means the same character."""
    if _CONTROL_IN_JSON.search(text):
        text = _CONTROL_IN_JSON.sub(_json_escaped, text)
    if invisible_at(text) is not None:
        text = _invisible().sub(_json_escaped, text)
    return text


def json_str(value: str) -> str:
    """``json.dumps(value)`` for a str (ASCII, as ``json.dumps`` writes it), DEL escaped."""
    out = encode_basestring_ascii(value)
    return out.replace("\x7f", "\\u007f") if "\x7f" in out else out
