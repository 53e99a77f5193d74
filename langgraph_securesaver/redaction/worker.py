"""A redaction worker process: ``python -m langgraph_securesaver.redaction.worker``.

It builds the default presidio engine once and answers detection requests on stdin/stdout,
one length-prefixed JSON frame each way (plus ``{"accepted": true}`` as it takes a request).
A request carries only the text to analyze and the detection settings; the answer carries
only spans, entity kinds and scores (or why the analysis stopped). Keys, tokens and vault
entries never leave the parent process, and nothing the worker sends is evaluated: it is
parsed as JSON and checked field by field.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any

from .frames import read_frame, write_frame

# Workers run at a lower CPU priority than the serving process: on a busy machine a large
# write's analysis yields the CPU to the other requests' turns rather than the other way
# round (the write's wall-clock deadline bounds how long it then takes; real turns stay
# in-process or finish well within it).
NICENESS = 5


def _redactor_for(params: dict[str, Any], cache: dict[str, Any]) -> Any:
    from .policy import Action, RedactionPolicy
    from .redactor import Redactor

    key = json.dumps(params, sort_keys=True)
    found = cache.get(key)
    if found is None:
        policy = RedactionPolicy(
            actions={k: Action.TOKENIZE for k in params["kinds"]},
            score_threshold=params["score_threshold"], max_chars=params["max_chars"],
            hard_max_chars=params["hard_max_chars"], time_budget=params["time_budget"],
            max_detections=params["max_detections"])
        found = (Redactor(policy, phone_regions=params["regions"], cache_size=0), policy)
        cache[key] = found
    return found


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
    from .engine import DEFAULT_PHONE_REGIONS
    from .redactor import Redactor

    Redactor(phone_regions=DEFAULT_PHONE_REGIONS).analyzer  # noqa: B018 - build the engine
    write_frame(out, {"ready": os.getpid()})
    cache: dict[str, Any] = {}
    while True:
        request = read_frame(inp)
        if request is None:
            return
        # taken: from here on a death of this process fails the parent's write (before it,
        # the parent analyzes the string itself)
        write_frame(out, {"accepted": True})
        started = time.process_time()  # the budget counts CPU seconds
        try:
            redactor, policy = _redactor_for(request["params"], cache)
            redactor.analyzer  # noqa: B018 - built once per settings, not charged to the write
            started = time.process_time()
            raw, reason = redactor.detect_raw(request["text"], policy,
                                              float(request["seconds"]))
            reply: dict[str, Any] = {"took": time.process_time() - started}
            if raw is None:
                reply["overrun"] = reason
            else:
                reply["raw"] = [[k, s, e, score] for (k, s, e), score in raw.items()]
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails closed
            reply = {"error": type(exc).__name__, "took": time.process_time() - started}
        write_frame(out, reply)


def main() -> None:  # pragma: no cover - run as a subprocess
    logging.basicConfig(level=logging.ERROR)
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":  # pragma: no cover
    main()
