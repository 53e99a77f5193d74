"""A live but slow holder: executes KEY with an effect that outlasts the heartbeat interval.

Usage: python slow_holder.py DB_URL KEYRING_FILE KEY MARKER_FILE SECONDS

Default policy. Touches MARKER_FILE once the claim is taken (the effect is running), sleeps
SECONDS inside the effect, records the execution in ``slow_effects`` (same database) and
prints {"replayed", "token"} as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sqlalchemy as sa

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import Claim, IdempotencyStore, KeyScope


def main() -> None:
    url, keyring, key, marker, seconds = sys.argv[1:6]
    with SecureSaver.from_url(url, keyring=Keyring.from_file(keyring), redaction=None) as saver:
        store = IdempotencyStore.for_saver(saver)
        scope = KeyScope("acme", "slow-thread", key, "business", "slow")

        def effect(claim: Claim) -> str:
            Path(marker).touch()
            time.sleep(float(seconds))
            with store.engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO slow_effects(pid, token) VALUES (:p, :t)"),
                             {"p": os.getpid(), "t": claim.token})
            return f"done by {os.getpid()}"

        out = store.execute(scope, effect)
        print(json.dumps({"replayed": out.replayed, "token": out.fencing_token}))


if __name__ == "__main__":
    main()
