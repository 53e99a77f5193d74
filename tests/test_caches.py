"""The token cache: unchanged channels reuse their authenticated ciphertext, never across
versions, tenants or threads, and never for plain integer versions."""

from __future__ import annotations

from pathlib import Path

from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.caches import TokenCache
from langgraph_securesaver.tenancy import ThreadRef, inner_thread_id
from tests.fake_agent import build_chat_graph


def test_unchanged_channels_reuse_the_stored_token(tmp_path: Path) -> None:
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        graph = build_chat_graph(saver)
        cfg = {"configurable": {"thread_id": "t", "tenant_id": "acme"}}
        for text in ("one", "two", "three"):
            graph.invoke({"messages": [HumanMessage(text)]}, cfg)
        rows = list(saver.inner.list({"configurable": {"thread_id": inner_thread_id("acme", "t"),
                                                       "checkpoint_ns": ""}}))
        by_version: dict[str, set[bytes]] = {}
        for row in rows:
            version = row.checkpoint["channel_versions"].get("messages")
            token = row.checkpoint["channel_values"].get("messages")
            if token is not None:
                by_version.setdefault(version, set()).add(token)
        reused = [v for v, tokens in by_version.items() if len(tokens) == 1]
        assert len(by_version) >= 3 and reused == list(by_version)
        assert len({t for tokens in by_version.values() for t in tokens}) == len(by_version)
        texts = [m.content for m in saver.get_tuple(cfg).checkpoint["channel_values"]["messages"]]
        assert [t for t in texts if t in ("one", "two", "three")] == ["one", "two", "three"]


def test_token_cache_is_keyed_by_place_and_version() -> None:
    cache = TokenCache(max_bytes=1000)
    a, b = ThreadRef("acme", "t"), ThreadRef("globex", "t")
    cache.put(a, "messages", "0001.42", b"token-a")
    assert cache.get(a, "messages", "0001.42") == b"token-a"
    assert cache.get(a, "messages", "0002.17") is None
    assert cache.get(b, "messages", "0001.42") is None
    assert cache.get(ThreadRef("acme", "u"), "messages", "0001.42") is None
    cache.put(a, "turns", 3, b"int-version")
    assert cache.get(a, "turns", 3) is None  # integer versions can repeat on forks
    for i in range(20):
        cache.put(ThreadRef("acme", f"x{i}"), "messages", f"{i}.5", b"x" * 100)
    assert cache.get(a, "messages", "0001.42") is None  # evicted by the byte budget
    cache.forget_thread("acme", "x19")
    assert cache.get(ThreadRef("acme", "x19"), "messages", "19.5") is None


def test_the_presidio_prefilter_lets_every_labelled_entity_through() -> None:
    """The pre-filter may only skip text in which no built-in recognizer could match."""
    import json

    from langgraph_securesaver.redaction.recognizers import CANDIDATE_RE
    from langgraph_securesaver.redaction.view import analysis_view
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "pii_eval.jsonl"
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line]
    positives = [r for r in rows if r["entities"]]
    assert len(positives) > 200
    for row in positives:
        for entity in row["entities"]:
            assert CANDIDATE_RE.search(analysis_view(entity["value"])), entity["kind"]
    for plain in ("turn 12: please summarise the previous answer in one line",
                  "Thanks, noted (turn 3): 好的，我明天再问", "Order shipped yesterday."):
        assert CANDIDATE_RE.search(analysis_view(plain)) is None


def test_prefiltered_text_is_not_analyzed_but_pii_still_is() -> None:
    from langgraph_securesaver.redaction import Redactor
    redactor = Redactor()
    redactor.redact("warm up", token_key=b"k" * 32)
    calls: list[str] = []
    real = redactor._analyze

    def counting(text, entities, threshold):
        calls.append(text)
        return real(text, entities, threshold)

    redactor._analyze = counting
    assert redactor.redact("turn 7: please summarise", token_key=b"k" * 32).entities == []
    assert calls == []
    found = redactor.redact("write to li.na@example.com", token_key=b"k" * 32).entities
    assert [e.kind for e in found] == ["EMAIL_ADDRESS"] and len(calls) == 1
