"""A chat turn and its read-back, for the tests that run one saver over each key provider
(tests/test_aws_kms.py, tests/test_pkcs11.py, tests/test_providers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from langgraph_securesaver import SecureSaver
from tests.fake_agent import build_chat_graph


def cfg(thread: str, tenant: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def say(saver: SecureSaver, tenant: str, thread: str, text: str) -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, cfg(thread, tenant))


def texts(saver: SecureSaver, tenant: str, thread: str) -> list[str]:
    tup = saver.get_tuple(cfg(thread, tenant))
    assert tup is not None
    return [str(m.content) for m in tup.checkpoint["channel_values"]["messages"]]


def open_saver(tmp_path: Path, keyring: Any) -> SecureSaver:
    """A SQLite SecureSaver without redaction (the provider is what these tests vary)."""
    return SecureSaver.from_url(f"sqlite:///{tmp_path / 'agent.db'}", keyring=keyring,
                                redaction=None)
