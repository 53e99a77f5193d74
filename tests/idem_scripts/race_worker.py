"""One process of the cross-process race: N threads execute the same key at START_AT.

Usage: python race_worker.py DB_URL KEYRING_FILE KEY READY_DIR THREADS

Each process writes a file into READY_DIR once it is set up and starts when two are there.

The effect inserts a row into ``race_effects`` (same database) and sleeps a little, so the
duplicates overlap. Prints a JSON list of {"replayed", "value", "token"} per thread.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sqlalchemy as sa

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import Claim, IdempotencyStore, KeyScope


def main() -> None:
    url, keyring, key, ready_dir, n = sys.argv[1:6]
    with SecureSaver.from_url(url, keyring=Keyring.from_file(keyring), redaction=None) as saver:
        store = IdempotencyStore.for_saver(saver)
        store.setup()
        store.tenant_keys("acme")
        scope = KeyScope("acme", "race-thread", key, "business", "race")
        results: list[dict] = []
        errors: list[str] = []
        Path(ready_dir, f"ready-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while len(list(Path(ready_dir).glob("ready-*"))) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the other process never got ready")
            time.sleep(0.002)
        start_at = time.time() + 0.05

        def effect(claim: Claim) -> str:
            with store.engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO race_effects(pid, token) VALUES (:p, :t)"),
                             {"p": os.getpid(), "t": claim.token})
            time.sleep(0.2)
            return f"executed by {os.getpid()}"

        def worker() -> None:
            while time.time() < start_at:
                time.sleep(0.001)
            try:
                out = store.execute(scope, effect)
                results.append({"replayed": out.replayed, "value": out.value,
                                "token": out.fencing_token})
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=worker) for _ in range(int(n))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"results": results, "errors": errors}))


if __name__ == "__main__":
    main()
