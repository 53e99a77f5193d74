"""Replay-aware tracing: the effect runs inside the call's span (its spans are children); a call
served from the store runs no effect spans and carries ``securesaver.replayed = true``.

Needs ``opentelemetry-api`` (the ``otel`` extra); a tiny recording TracerProvider stands in for
an SDK so nothing else is required.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

trace = pytest.importorskip("opentelemetry.trace")

from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

from langgraph_securesaver import Keyring, SecureSaver  # noqa: E402
from langgraph_securesaver.idempotency import (  # noqa: E402
    current_idempotency_key,
    idempotent,
)
from langgraph_securesaver.idempotency import tracing as idem_tracing  # noqa: E402

from .idem_scripts.scenario import Downstream  # noqa: E402
from .test_idempotency_graph import CFG, Flaky, agent_graph  # noqa: E402


class RecSpan(trace.Span):
    def __init__(self, name: str, parent: Any, attributes: Any) -> None:
        self.name = name
        self.parent = parent
        self.attributes: dict[str, Any] = dict(attributes or {})
        self._ctx = trace.SpanContext(trace_id=1, span_id=id(self) & 0xFFFFFFFF or 1,
                                      is_remote=False)

    def end(self, end_time: int | None = None) -> None: ...
    def get_span_context(self) -> Any:
        return self._ctx
    def set_attributes(self, attributes: Any) -> None:
        self.attributes.update(attributes)
    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value
    def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None: ...
    def update_name(self, name: str) -> None:
        self.name = name
    def is_recording(self) -> bool:
        return True
    def set_status(self, status: Any, description: Any = None) -> None: ...
    def record_exception(self, exception: Any, attributes: Any = None, timestamp: Any = None,
                         escaped: bool = False) -> None: ...


class RecTracer(trace.Tracer):
    def __init__(self, spans: list[RecSpan]) -> None:
        self.spans = spans

    def start_span(self, name: str, context: Any = None, kind: Any = None,
                   attributes: Any = None, links: Any = None, start_time: Any = None,
                   record_exception: bool = True, set_status_on_exception: bool = True) -> Any:
        span = RecSpan(name, trace.get_current_span(context), attributes)
        self.spans.append(span)
        return span

    @contextmanager
    def start_as_current_span(self, name: str, context: Any = None, kind: Any = None,
                              attributes: Any = None, links: Any = None,
                              start_time: Any = None, record_exception: bool = True,
                              set_status_on_exception: bool = True,
                              end_on_exit: bool = True) -> Iterator[Any]:
        span = self.start_span(name, context, kind, attributes)
        with trace.use_span(span, end_on_exit=end_on_exit):
            yield span


class RecProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self.spans: list[RecSpan] = []

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return RecTracer(self.spans)


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> RecProvider:
    prov = RecProvider()
    monkeypatch.setattr(idem_tracing._trace, "get_tracer",
                        lambda *a, **k: prov.get_tracer(*a, **k))
    return prov


def test_replayed_calls_are_marked_and_run_no_effect_spans(tmp_path: Path,
                                                           provider: RecProvider) -> None:
    downstream = Downstream(str(tmp_path / "ds.db"))
    flaky = Flaky(1)
    tracer = provider.get_tracer("app")

    @tool
    @idempotent
    def send_email(to: str) -> str:
        """Send an email."""
        with tracer.start_as_current_span("smtp.send"):  # the effect's own span
            return downstream.send_email(current_idempotency_key(), to)

    @tool
    @idempotent
    def charge_card(amount: int) -> str:
        """Charge the card."""
        with tracer.start_as_current_span("payments.charge"):
            result = downstream.charge(current_idempotency_key(), amount)
        flaky.maybe_fail()
        return result

    assert idem_tracing.otel_available()
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'cp.db'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        graph = agent_graph(saver, ToolNode([send_email, charge_card]))
        with pytest.raises(ConnectionError):
            graph.invoke({"messages": [HumanMessage("pay")]}, CFG, durability="sync")
        outer = tracer.start_span("tool-span-of-the-resume")
        with trace.use_span(outer):
            graph.invoke(None, CFG, durability="sync")

    calls = [s for s in provider.spans if s.name.startswith("securesaver.idempotent ")]
    by_name = [(s.name.split(" ", 1)[1], s.attributes.get("securesaver.replayed"))
               for s in calls]
    assert sorted(by_name) == sorted([("send_email", False), ("charge_card", False),
                                      ("send_email", True), ("charge_card", False)])
    effects = [s for s in provider.spans if s.name in ("smtp.send", "payments.charge")]
    assert sorted(s.name for s in effects) == ["payments.charge", "payments.charge",
                                               "smtp.send"]  # nothing emitted on the replay
    for span in effects:  # effect spans belong to their recorded call
        assert span.parent in calls and not span.parent.attributes["securesaver.replayed"]
    replayed = next(s for s in calls if s.attributes.get("securesaver.replayed"))
    assert replayed.attributes["securesaver.idempotency.key"].startswith("ssik1_")
    assert replayed.parent.attributes.get("securesaver.replayed") is True  # enclosing span
