"""Format an exception the ways error reporters do, and search the output for key material.

Reporters that "show locals" (Sentry, rich, structlog, ``traceback`` with
``capture_locals=True``) print the ``repr`` of every local of every frame between the raise and
the handler, for the exception and every exception chained to it. :func:`reports` produces
those texts; :func:`leaks` finds any form of a key in them (raw ``bytes`` repr, hex, base64,
base64url, with or without padding, and their prefixes, since reporters truncate long values).
"""

from __future__ import annotations

import base64
import io
import logging
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pygments.lexer import Lexer
from rich.console import Console
from rich.logging import RichHandler
from rich.traceback import Traceback

#: how many leading characters of an encoded key still count as the key (reporters cut long
#: values at 80 characters, a 32-byte key is 44 in base64)
PREFIX = 20


def forms(key: bytes) -> list[str]:
    """Every printable form of ``key`` a reporter could show, full and as a prefix."""
    encoded = [key.hex(), key.hex().upper(),
               base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode()]
    out = {repr(key), repr(key)[:PREFIX + 2]}   # b'...' as reprs print it
    out |= set(encoded) | {e.rstrip("=") for e in encoded} | {e[:PREFIX] for e in encoded}
    return sorted(out)


@dataclass
class Secrets:
    """Key material a test must never find in a report: keys (bytes) and texts (env values)."""

    keys: dict[str, bytes] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    def add_key(self, name: str, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"{name}: a key is at least 16 bytes")
        self.keys[name] = bytes(key)

    def add_text(self, name: str, text: str) -> None:
        self.texts[name] = text

    def needles(self) -> Iterator[tuple[str, str]]:
        for name, key in self.keys.items():
            for form in forms(key):
                yield name, form
        for name, text in self.texts.items():
            yield name, text     # its key parts are searched as keys


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception chained to it, suppressed contexts included (a reporter
    may walk ``__context__`` whatever ``__suppress_context__`` says)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return seen


def with_traceback_locals(exc: BaseException) -> str:
    parts = []
    for e in chain(exc):
        parts.extend(traceback.TracebackException(
            type(e), e, e.__traceback__, capture_locals=True).format())
        # what the exception object itself carries (e.g. JSONDecodeError.doc)
        parts.append(repr(e.args))
        parts.append(repr(getattr(e, "__dict__", {})))
    return "".join(parts)


#: pygments tokens per (lexer class, lexer options, source text): see ``_lexed_once``
_LEXED: dict[tuple[Any, ...], list[Any]] = {}
_get_tokens = Lexer.get_tokens


def _cached_get_tokens(self: Lexer, text: Any, unfiltered: bool = False) -> Iterator[Any]:
    key = (type(self), repr(sorted(self.options.items())), unfiltered, text)
    if key not in _LEXED:
        _LEXED[key] = list(_get_tokens(self, text, unfiltered))
    return iter(_LEXED[key])


@contextmanager
def _lexed_once() -> Iterator[None]:
    """rich's tracebacks highlight each frame's code by lexing its source file with pygments
    from the top (most of the CPU of a report, and of these tests). A file's tokens are the
    same in every report: lexed once per lexer and source text, the reports are the same text,
    and cost what the locals do."""
    Lexer.get_tokens = _cached_get_tokens  # type: ignore[method-assign]
    try:
        yield
    finally:
        Lexer.get_tokens = _get_tokens  # type: ignore[method-assign]


def with_rich_locals(exc: BaseException) -> str:
    with _lexed_once():
        return _with_rich_locals(exc)


def _with_rich_locals(exc: BaseException) -> str:
    out = []
    for e in chain(exc):
        console = Console(file=io.StringIO(), record=True, width=4000, color_system=None)
        console.print(Traceback.from_exception(
            type(e), e, e.__traceback__, show_locals=True, width=4000, max_frames=0,
            locals_max_string=None, locals_max_length=None))
        out.append(console.export_text())
    return "".join(out)


def with_logging(exc: BaseException) -> str:
    with _lexed_once():
        return _with_logging(exc)


def _with_logging(exc: BaseException) -> str:
    stream = io.StringIO()
    logger = logging.getLogger("securesaver-secrecy-test")
    logger.propagate = False
    plain = logging.StreamHandler(stream)
    rich_console = Console(file=stream, width=4000, color_system=None)
    fancy = RichHandler(console=rich_console, rich_tracebacks=True,
                        tracebacks_show_locals=True, tracebacks_width=4000)
    for handler in (plain, fancy):
        logger.addHandler(handler)
    try:
        logger.error("the operation failed", exc_info=exc)
    finally:
        for handler in (plain, fancy):
            logger.removeHandler(handler)
    return stream.getvalue()


REPORTERS: dict[str, Callable[[BaseException], str]] = {
    "traceback-capture_locals": with_traceback_locals,
    "rich-show_locals": with_rich_locals,
    "logging-exc_info": with_logging,
}


def capture(fn: Callable[[], object]) -> BaseException:
    """The exception ``fn`` raises (it must raise). Give it no secret in a closure: a
    closure's cells are locals of its frame."""
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError(f"{fn} did not raise")


def leaks(exc: BaseException, secrets: Secrets,
          reporters: Iterable[str] = tuple(REPORTERS)) -> list[tuple[str, str, str]]:
    """(reporter, secret name, found form) for every form of every secret in a report."""
    found = []
    for reporter in reporters:
        text = REPORTERS[reporter](exc)
        for name, needle in secrets.needles():
            if needle in text:
                found.append((reporter, name, needle[:12] + "..."))
    return found
