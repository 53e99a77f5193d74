"""The library's KMS client never writes key material to a log, at any level.

With the root logger at DEBUG, botocore logs every request and response body: Encrypt's
plaintext and Decrypt's result are the data, index and KEK keys and the registry MAC key, in
base64 (on main, every one of them). Every record of every logger is captured at DEBUG while a
saver on the AWS KMS provider (moto's server) writes and reads turns of two tenants, cold
(keys unwrapped again) and warm, sync and async, and each key KMS wrapped or unwrapped is
searched for in every form (raw, hex, base64, base64url, prefixes).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider
from tests.fake_agent import build_chat_graph

from .provider_helpers import cfg, open_saver, say, texts
from .secrecy_helpers import forms


class Everything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            message = f"{record.msg!r} {record.args!r}"
        self.texts.append(f"{record.name} {message} {record.args!r}")


@pytest.fixture
def all_logs() -> Any:
    handler, root = Everything(), logging.getLogger()
    before = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def _spy(provider: AwsKmsKeyProvider, keys: list[bytes]) -> None:
    """Record every key the provider hands KMS or gets back from it."""
    wrap, unwrap = provider.wrap, provider.unwrap

    def spy_wrap(tenant: str, key: Any, context: bytes) -> Any:
        keys.append(bytes(key.reveal() if hasattr(key, "reveal") else key))
        return wrap(tenant, key, context)

    def spy_unwrap(*args: Any) -> bytes:
        out = unwrap(*args)
        keys.append(bytes(out))
        return out

    provider.wrap = spy_wrap  # type: ignore[method-assign]
    provider.unwrap = spy_unwrap  # type: ignore[method-assign]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_no_key_material_in_any_log_record(tmp_path: Path, kms_alias: str, all_logs: Any,
                                           use_async: bool) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    keys: list[bytes] = []
    _spy(provider, keys)
    if not use_async:
        with open_saver(tmp_path, provider) as saver:
            for tenant in ("acme", "globex"):
                say(saver, tenant, "t", f"hello from {tenant}")
            saver.keys.forget()                  # cold: every key unwrapped again
            for tenant in ("acme", "globex"):
                assert f"hello from {tenant}" in texts(saver, tenant, "t")
    else:
        async def run() -> None:
            url = f"sqlite:///{tmp_path / 'agent.db'}"
            async with SecureSaver.afrom_url(url, keyring=provider, redaction=None) as saver:
                graph = build_chat_graph(saver)
                for tenant in ("acme", "globex"):
                    await graph.ainvoke({"messages": [HumanMessage(f"hi {tenant}")]},
                                        cfg("t", tenant))
                saver.keys.forget()
                for tenant in ("acme", "globex"):
                    tup = await saver.aget_tuple(cfg("t", tenant))
                    assert tup is not None

        asyncio.run(run())
    assert len({k for k in keys}) >= 6           # data, index, KEK keys and the MAC key
    wire = [t for t in all_logs.texts if t.startswith("botocore")]
    assert wire, "botocore logged nothing at DEBUG: the capture does not work"
    found = sorted({(i, form) for i, key in enumerate(set(keys)) for form in forms(key)
                    for text in all_logs.texts if form in text})
    assert found == [], f"{len(found)} key forms in the logs"
