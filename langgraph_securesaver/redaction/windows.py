"""Where a context window around a match must stop: the joint of a batch of strings.

Redaction analyzes many strings in one analyzer call, joined by :data:`BATCH_SEP`; a
validator or veto that reads the text around a match (an e-mail's scp-path look-ahead, a
label before a number) must not read another string of the batch, or one string would be
judged by its neighbour's text. Text only; imports nothing.
"""

from __future__ import annotations

# Joins the strings of one batch (a list, content parts, a JSON document) for a single
# analyzer call: NUL is blank to every recognizer (not a word character, not whitespace, not
# phone punctuation). A context window a validator or veto reads around a match stops at it
# (:func:`window_start`, :func:`window_end`), so no string is judged by its neighbour's text.
BATCH_SEP = "\x00\x00\n\x00\x00"


def window_start(text: str, lo: int, at: int) -> int:
    """``lo``, or past the last batch separator between ``lo`` and ``at``."""
    cut = text.rfind(BATCH_SEP, lo, at)
    return lo if cut < 0 else cut + len(BATCH_SEP)


def window_end(text: str, at: int, hi: int) -> int:
    """``hi``, or the first batch separator between ``at`` and ``hi``."""
    cut = text.find(BATCH_SEP, at, hi)
    return hi if cut < 0 else cut
