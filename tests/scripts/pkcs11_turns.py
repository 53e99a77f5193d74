"""An application process on a PKCS#11 key provider: 1,000 turns of 10 tenants.

    python -m tests.scripts.pkcs11_turns DB_URL PROVIDER_URL

Prints one JSON line: the number of key rows and the provider's own count of token operations.
The test runs it with the module behind OpenSC's pkcs11-spy, which logs every call the module
receives, so the two counts can be compared (a process of its own: the spy and the module it
wraps cannot both be initialized in one process that already loaded the module).
"""

from __future__ import annotations

import json
import sys

from langchain_core.messages import HumanMessage

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
from tests.fake_agent import build_chat_graph


def main(db_url: str, provider_url: str) -> None:
    provider = Pkcs11KeyProvider.from_url(provider_url)
    provider.calls.clear()
    tenants = [f"tenant-{i}" for i in range(10)]
    with SecureSaver.from_url(db_url, keyring=provider, redaction=None) as saver:
        graph = build_chat_graph(saver)
        for turn in range(100):
            for tenant in tenants:
                graph.invoke({"messages": [HumanMessage(f"turn {turn}")]},
                             {"configurable": {"thread_id": f"t{turn % 10}", "tenant_id": tenant}})
        rows = sum(len(saver.registry.load_key_rows(t)) for t in tenants)
    print(json.dumps({"rows": rows, "calls": dict(provider.calls)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
