"""Optional OpenTelemetry spans for idempotent calls (no-op without ``opentelemetry-api``).

Each idempotent call gets a span ``securesaver.idempotent <name>``; the effect runs inside it,
so spans the effect emits are its children and belong to the recorded step. A call served
from the store does not run the effect (no child spans) and carries
``securesaver.replayed = true`` on its own span and on the span that was current when the call
started (e.g. an instrumented tool span), so cost-per-span accounting can skip replays.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .keys import KeyScope

logger = logging.getLogger(__name__)

TRACER_NAME = "langgraph_securesaver.idempotency"
ATTR_REPLAYED = "securesaver.replayed"
ATTR_KEY = "securesaver.idempotency.key"
ATTR_KIND = "securesaver.idempotency.kind"
ATTR_NAME = "securesaver.idempotency.name"
ATTR_ATTEMPT = "securesaver.idempotency.attempt"
ATTR_FENCING = "securesaver.idempotency.fencing_token"

_trace: Any
try:  # optional dependency (the "otel" extra)
    _trace = importlib.import_module("opentelemetry.trace")
except ImportError:  # pragma: no cover - exercised when the extra is not installed
    _trace = None


def otel_available() -> bool:
    return _trace is not None


class CallSpan:
    """Handle on the span of one idempotent call (a no-op without OpenTelemetry)."""

    def __init__(self, span: Any, parent: Any) -> None:
        self._span = span
        self._parent = parent

    def outcome(self, *, replayed: bool, attempt: int, fencing_token: int) -> None:
        if self._span is None:
            return
        try:
            self._span.set_attribute(ATTR_REPLAYED, replayed)
            self._span.set_attribute(ATTR_ATTEMPT, attempt)
            self._span.set_attribute(ATTR_FENCING, fencing_token)
            if replayed and self._parent is not None and self._parent.is_recording():
                self._parent.set_attribute(ATTR_REPLAYED, True)
        except Exception:  # tracing must never break the effect
            logger.debug("could not set span attributes", exc_info=True)


@contextmanager
def call_span(scope: KeyScope) -> Iterator[CallSpan]:
    if _trace is None:
        yield CallSpan(None, None)
        return
    parent = _trace.get_current_span()
    tracer = _trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"securesaver.idempotent {scope.name}",
        attributes={ATTR_KEY: scope.key, ATTR_KIND: scope.kind, ATTR_NAME: scope.name},
    ) as span:
        yield CallSpan(span, parent)
