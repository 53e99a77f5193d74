"""A process flooding refused cross-tenant reads, for the coalesced-denial tests.

usage: denial_flood.py URL COUNT THREADS   (keyring from SECURESAVER_MASTER_KEY)
THREADS threads under ``tenant_scope("mallory")`` each call ``get_tuple`` COUNT times with a
config naming tenant ``victim``; prints the number of AccessDenied raised. The saver is closed
(its pending summaries flushed) on the way out.
"""

from __future__ import annotations

import sys
import threading

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, tenant_scope


def main() -> int:
    url, count, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    raised = [0] * threads
    cfg = {"configurable": {"thread_id": "t1", "tenant_id": "victim"}}
    with SecureSaver.from_url(url, keyring=Keyring.from_env(), redaction=None) as saver:
        def flood(slot: int) -> None:
            with tenant_scope("mallory"):
                for _ in range(count):
                    try:
                        saver.get_tuple(cfg)
                    except AccessDenied:
                        raised[slot] += 1

        workers = [threading.Thread(target=flood, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    print("raised", sum(raised), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
