"""A process appending events and receipts, for the concurrent-writer chain tests.

usage: registry_writer.py URL NAME COUNT   (keyring from SECURESAVER_MASTER_KEY)
Each step records an event for tenant acme, one for globex, one tenant-less event, and a batch
of two receipts (one per tenant), so the four chains are extended by both processes at once.
"""

from __future__ import annotations

import sys

from langgraph_securesaver import Keyring, SecureSaver


def main() -> int:
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with SecureSaver.from_url(url, keyring=Keyring.from_env(), redaction=None) as saver:
        registry = saver.registry
        for i in range(count):
            registry.record_event("writer_step", tenant="acme", actor=name, step=i)
            registry.record_event("writer_step", tenant="globex", actor=name, step=i)
            registry.record_event("writer_step", actor=name, step=i)
            registry.add_receipts([
                {"tenant": "acme", "thread_id": f"{name}-{i}", "action": "deleted",
                 "reason": "test", "requested_by": name, "detail": {"i": i}},
                {"tenant": "globex", "thread_id": f"{name}-{i}", "action": "deleted",
                 "reason": "test", "requested_by": name, "detail": {"i": i}}])
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
