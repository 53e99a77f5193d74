"""Step bodies: one generator for the sync and the async API.

A body yields ``(request, argument)`` pairs and gets each answer sent back; a request that
fails is thrown into the body at the ``yield`` that made it, so the body's own handlers (e.g.
:func:`.listing.decoding` around a lookup) see the failure as they would around a direct
call. :func:`run_steps` serves the requests with sync I/O, :func:`arun_steps` awaits them.
Knows nothing of what the requests are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

T = TypeVar("T")
Steps = Generator[tuple[str, Any], Any, T]  # a body yielding (request, argument)


def run_steps(steps: Steps[T], serve: Callable[[str, Any], Any]) -> T:
    """Drive a step body with sync I/O: each request's answer is sent back, its failure
    thrown in (so the body's own handlers, e.g. ``decoding``, see it)."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            kind, arg = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        try:
            reply, error = serve(kind, arg), None
        except Exception as exc:  # noqa: BLE001 - thrown into the body, which re-raises
            reply, error = None, exc


async def arun_steps(steps: Steps[T], serve: Callable[[str, Any], Awaitable[Any]],
                     offload: Callable[..., Awaitable[Any]] | None = None) -> T:
    """:func:`run_steps` with async I/O (every request awaited). ``offload``: runs the
    body's CPU work between requests (decryption, say) off the event loop, as
    ``await offload(fn, *args)``."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            if offload is None:
                kind, arg = steps.send(reply) if error is None else steps.throw(error)
            else:  # StopIteration cannot cross a future: it comes back as a value
                step = await offload(_advance, steps, reply, error)
                if isinstance(step, _Done):
                    return cast(T, step.value)
                kind, arg = step
        except StopIteration as done:
            return cast(T, done.value)
        try:
            reply, error = await serve(kind, arg), None
        except Exception as exc:  # noqa: BLE001 - thrown into the body, which re-raises
            reply, error = None, exc


class _Done:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _advance(steps: Steps[Any], reply: Any, error: Exception | None) -> Any:
    """One step of the body (in another thread): its next request, or :class:`_Done`."""
    try:
        return steps.send(reply) if error is None else steps.throw(error)
    except StopIteration as done:
        return _Done(done.value)
