"""One recovery worker process: waits for its peer, then runs one recover_main sweep.

Usage: python recover_worker.py DB_URL KEYRING_FILE READY_DIR WORKER_ID
Prints the RecoveryReport as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from langgraph_securesaver.idempotency import recover_main


def main() -> None:
    url, keyring, ready_dir, worker_id = sys.argv[1:5]
    logging.basicConfig(level=logging.WARNING)
    import tests.idem_scripts.recovery_graph  # noqa: F401  (import cost before the barrier)
    Path(ready_dir, f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while len(list(Path(ready_dir).glob("ready-*"))) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the other worker never got ready")
        time.sleep(0.002)
    report = recover_main(url, "tests.idem_scripts.recovery_graph:factory", keyring=keyring,
                          older_than=0, max_attempts=3, worker_id=worker_id, redaction=None)
    print(json.dumps({"worker": report.worker_id, "examined": report.examined,
                      "resumed": [list(x) for x in report.resumed],
                      "failed": [list(x) for x in report.failed],
                      "busy": report.skipped_busy,
                      "finished": [list(x) for x in report.finished]}))


if __name__ == "__main__":
    main()
