"""Decoding views: percent-encoding and HTML character references decoded, with an exact map
from every decoded character back to the span of original characters it came from; and the
Unicode ``Default_Ignorable_Code_Point`` property (invisible characters an analysis view drops).

``ann%40example.com``, ``ann&#64;example.com`` and ``ann\\u0040example.com`` are the address
``ann@example.com`` to every reader that decodes them (a browser, a mail client, a JSON or
JavaScript parser, the next tool), so they are analyzed decoded, and what is found there is
replaced in the original text. Encodings nest (``ann%2540example.com`` is a URL encoded twice,
``ann%26%2364;example.com`` an entity percent-encoded): decoding is repeated on its own output
up to :data:`MAX_PASSES` times, the offset maps composed, so the map still points at the
original characters. Base64, quoted-printable and other transfer encodings are not decoded
(data URLs are, elsewhere). Pure functions.
"""

from __future__ import annotations

import html.entities
import re
from collections.abc import Callable

import regex

# Derived from the Unicode property (the regex module ships the character database), not
# from a hand list: the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0 are in it.
_DEFAULT_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")


def is_default_ignorable(ch: str) -> bool:
    return _DEFAULT_IGNORABLE.match(ch) is not None


def drop_default_ignorables(text: str) -> str:
    return _DEFAULT_IGNORABLE.sub("", text)


DECODABLE = re.compile(
    r"(?:%[0-9A-Fa-f]{2})+"
    r"|&#[0-9]{1,7};?|&#[xX][0-9A-Fa-f]{1,6};?|&[A-Za-z][A-Za-z0-9]{1,31};"
    r"|(?:\\u[0-9A-Fa-f]{4})+|\\x[0-9A-Fa-f]{2}")
#: how many times decoding is applied to its own output (an encoding nested that deep is
#: still seen through; one nested deeper is analyzed as its outer layers decode it)
MAX_PASSES = 4
_HTML5 = html.entities.html5


def _char(code: int) -> str | None:
    if code <= 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return None
    return chr(code)


def _decode_reference(ref: str) -> str | None:
    """One HTML character reference (``&#64;``, ``&#x40;``, ``&commat;``) or None."""
    if ref.startswith("&#"):
        body = ref[2:].rstrip(";")
        return _char(int(body[1:], 16) if body[:1] in "xX" else int(body))
    return _HTML5.get(ref[1:])


def _decode_percent(run: str, start: int, out: list[str], starts: list[int],
                    ends: list[int]) -> None:
    """A run of ``%XX`` escapes decoded as UTF-8, character by character; an escape that is
    not part of a valid sequence stays as written."""
    data = bytes.fromhex(run.replace("%", ""))
    i = 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else \
            4 if lead >> 3 == 30 else 0
        ch = None
        if size:
            try:
                ch = data[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                ch = None
        if ch is None or len(ch) != 1:
            size = 1
            ch = None
        pos = start + 3 * i
        if ch is None:
            _copy(run, 3 * i, 3 * i + 3, pos - 3 * i, out, starts, ends)
        else:
            out.append(ch)
            starts.append(pos)
            ends.append(pos + 3 * size)
        i += size


def _copy(text: str, lo: int, hi: int, base: int, out: list[str], starts: list[int],
          ends: list[int]) -> None:
    """Copy ``text[lo:hi]`` unchanged (original offsets = index + ``base``)."""
    out.append(text[lo:hi])
    starts.extend(range(base + lo, base + hi))
    ends.extend(range(base + lo + 1, base + hi + 1))


def _decode_escapes(run: str, start: int, out: list[str], starts: list[int],
                    ends: list[int]) -> None:
    """A run of ``\\uXXXX`` escapes (JSON, JavaScript, Java, Python): a surrogate pair is one
    character; a lone surrogate stays as written."""
    units = [int(run[i + 2:i + 6], 16) for i in range(0, len(run), 6)]
    i = 0
    while i < len(units):
        unit, pos = units[i], start + 6 * i
        if 0xD800 <= unit <= 0xDBFF and i + 1 < len(units) and 0xDC00 <= units[i + 1] <= 0xDFFF:
            out.append(chr(0x10000 + ((unit - 0xD800) << 10) + units[i + 1] - 0xDC00))
            starts.append(pos)
            ends.append(pos + 12)
            i += 2
            continue
        ch = _char(unit)
        if ch is None:
            _copy(run, 6 * i, 6 * i + 6, start, out, starts, ends)
        else:
            out.append(ch)
            starts.append(pos)
            ends.append(pos + 6)
        i += 1


def _decode_once(text: str) -> tuple[str, list[int], list[int]] | None:
    """One pass of :func:`decoded_view` (no repetition)."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    changed = False
    for m in DECODABLE.finditer(text):
        s, e = m.span()
        _copy(text, pos, s, 0, out, starts, ends)
        pos = e
        ref = m.group(0)
        if ref[0] == "%":
            _decode_percent(ref, s, out, starts, ends)
            changed = True
            continue
        if ref[:2] == "\\u":
            _decode_escapes(ref, s, out, starts, ends)
            changed = True
            continue
        decoded = _char(int(ref[2:], 16)) if ref[:2] == "\\x" else _decode_reference(ref)
        if decoded is None:
            _copy(text, s, e, 0, out, starts, ends)
            continue
        changed = True
        for ch in decoded:
            out.append(ch)
            starts.append(s)
            ends.append(e)
    if not changed:
        return None
    _copy(text, pos, len(text), 0, out, starts, ends)
    return "".join(out), starts, ends


def decoded_view(text: str, expired: Callable[[], bool] | None = None
                 ) -> tuple[str, list[int], list[int]] | None:
    """(decoded text, starts, ends): decoded character ``i`` came from
    ``text[starts[i]:ends[i]]``. None when nothing in ``text`` decodes.

    Decoding is applied again to its own output while that still holds something to decode,
    at most :data:`MAX_PASSES` times in all; each pass maps onto the text it decoded, and
    the maps are composed so the result maps onto ``text``. ``expired`` (the caller's time
    budget) stops the repetition early: the caller then withholds the text anyway."""
    view = _decode_once(text)
    if view is None:
        return None
    decoded, starts, ends = view
    for _ in range(MAX_PASSES - 1):
        if (expired is not None and expired()) or DECODABLE.search(decoded) is None:
            break
        again = _decode_once(decoded)
        if again is None:
            break
        decoded, inner_starts, inner_ends = again
        starts, ends = ([starts[i] for i in inner_starts],
                        [ends[i - 1] for i in inner_ends])
    return decoded, starts, ends


def decode_text(text: str) -> str:
    """``text`` with percent escapes and character references decoded (normalization)."""
    view = decoded_view(text) if DECODABLE.search(text) else None
    return text if view is None else view[0]
