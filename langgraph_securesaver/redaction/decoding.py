"""Decoding views: percent-encoding and HTML character references decoded, with an exact map
from every decoded character back to the span of original characters it came from; and the
Unicode ``Default_Ignorable_Code_Point`` property (invisible characters an analysis view drops).

``ann%40example.com`` and ``ann&#64;example.com`` are the address ``ann@example.com`` to every
reader that decodes them (a browser, a mail client, the next tool), so they are analyzed
decoded, and what is found there is replaced in the original text. Pure functions.
"""

from __future__ import annotations

import html.entities
import re

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
    r"|&#[0-9]{1,7};?|&#[xX][0-9A-Fa-f]{1,6};?|&[A-Za-z][A-Za-z0-9]{1,31};")
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


def decoded_view(text: str) -> tuple[str, list[int], list[int]] | None:
    """(decoded text, starts, ends): decoded character ``i`` came from
    ``text[starts[i]:ends[i]]``. None when nothing in ``text`` decodes."""
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
        decoded = _decode_reference(ref)
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


def decode_text(text: str) -> str:
    """``text`` with percent escapes and character references decoded (normalization)."""
    view = decoded_view(text) if DECODABLE.search(text) else None
    return text if view is None else view[0]
