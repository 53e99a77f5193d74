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

Everything else is allowed: letters of every script (CJK, Arabic, Hebrew, ...), digits,
punctuation, spaces inside an id, emoji, and the joiners U+200C/U+200D that some scripts
and emoji sequences need.

:func:`validate_id_text` refuses such characters in ids at the API (tenant ids, thread ids,
checkpoint namespaces, actors); :func:`escape_controls` shows each one as ``\\xNN`` /
``\\uNNNN`` for values that reach a terminal anyway (rows written before the check, or by
someone who writes the database directly), and :func:`json_safe` does the same inside JSON
text (``\\u00NN``).
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring_ascii

from .errors import ConfigurationError

#: the code points refused in ids and escaped on output (see the module doc)
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
CONTROL_CHARS = "\x00-\x1f" + _BEYOND_C0
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")
# in JSON text a raw line feed is the indentation's, never a string's (json.dumps escapes C0)
_CONTROL_IN_JSON = re.compile(f"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")


def has_controls(text: str) -> bool:
    return _CONTROL.search(text) is not None


def validate_id_text(text: str, what: str) -> str:
    """``text`` unchanged, or :class:`ConfigurationError` naming the first control character
    (by code point: the message is printed too)."""
    found = _CONTROL.search(text)
    if found is not None:
        raise ConfigurationError(
            f"{what} holds the control character U+{ord(found.group()):04X} at position "
            f"{found.start()}; ids may not hold C0/C1 controls, DEL, bidirectional controls "
            "or line separators (they would steer the terminal of whoever reads them)")
    return text


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as ``\\xNN`` or ``\\uNNNN``."""
    return _CONTROL.sub(_escaped, text) if _CONTROL.search(text) else text


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_safe(text: str) -> str:
    """JSON text (from ``json.dumps``) with every control character still raw in it written
    ``\\uNNNN``; line feeds of the indentation stay.

    ``json.dumps`` already escapes C0 in strings (and, with ``ensure_ascii``, everything else
    but DEL); with ``ensure_ascii=False`` C1 controls, bidi controls and separators stay raw.
    Those can only stand inside string literals, where the escape means the same character."""
    return (_CONTROL_IN_JSON.sub(_json_escaped, text) if _CONTROL_IN_JSON.search(text)
            else text)


def json_str(value: str) -> str:
    """``json.dumps(value)`` for a str (ASCII, as ``json.dumps`` writes it), DEL escaped."""
    out = encode_basestring_ascii(value)
    return out.replace("\x7f", "\\u007f") if "\x7f" in out else out
