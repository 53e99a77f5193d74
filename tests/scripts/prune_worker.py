"""A pruner process for the concurrency and SIGKILL tests.

usage: prune_worker.py URL NOW [--batch N] [--lease S] [--slow S]
Prints one line per processed thread ("progress <done>") and a final "report <json>".
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.keys.keyring import Keyring


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("now", type=float)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--lease", type=float, default=300.0)
    parser.add_argument("--slow", type=float, default=0.0)
    args = parser.parse_args()

    def progress(done: int, total: int) -> None:
        print(f"progress {done}", flush=True)
        if args.slow:
            time.sleep(args.slow)

    # the pruner needs the keyring (from SECURESAVER_MASTER_KEY) to verify the registry rows'
    # MACs; it never decrypts checkpoints
    with SecureSaver.from_url(args.url, keyring=Keyring.from_env(), redaction=None) as saver:
        report = saver.prune_expired(now=args.now, batch=args.batch, lease=args.lease,
                                     progress=progress)
    print("report " + json.dumps(report.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
