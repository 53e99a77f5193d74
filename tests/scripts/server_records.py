"""Reads LangGraph Server's in-memory persistence file (``.langgraph_api/.langgraph_ops.pckl``)
for tests/test_server.py, in its own process (unpickling imports the server's modules, which
read their configuration from the environment on import). A sealed file is opened with the keys
of ``SECURESAVER_URL`` / ``SECURESAVER_KEYRING_FILE`` first.

    python -m tests.scripts.server_records find FILE < needles.json   -> [[needle, path], ...]
    python -m tests.scripts.server_records tokens FILE    -> [[path, "ss1...", record id], ...]

A path is the dotted route to a string inside the pickled records (``threads.0.metadata.topic``;
objects by their class name: ``threads.0.values.messages.0.HumanMessage.content``).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Iterator
from typing import Any

for key, value in {"LANGGRAPH_RUNTIME_EDITION": "inmem", "REDIS_URI": "fake",
                   "DATABASE_URI": ":memory:", "MIGRATIONS_PATH": "__inmem"}.items():
    os.environ.setdefault(key, value)


def strings(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Every string (and bytes, as latin-1) in the records with its path."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, (*path, str(k)))
    elif isinstance(node, (list, tuple, set, frozenset)):
        for i, v in enumerate(node):
            yield from strings(v, (*path, str(i)))
    elif isinstance(node, str):
        yield ".".join(path), node
    elif isinstance(node, (bytes, bytearray)):
        yield ".".join(path), bytes(node).decode("latin-1")
    elif hasattr(node, "__dict__"):
        yield from strings(vars(node), (*path, type(node).__name__))


_ID_FIELDS = {"threads": "thread_id", "runs": "run_id", "assistants": "assistant_id",
              "assistant_versions": "assistant_id", "crons": "cron_id"}


def load(file: str) -> Any:
    from langgraph_securesaver.server.records import RecordsSealer, is_sealed
    with open(file, "rb") as fh:
        data = fh.read()
    if not is_sealed(data):
        return pickle.loads(data)
    sealer = RecordsSealer()
    try:
        return sealer.read(file)
    finally:
        sealer.close()


def main() -> None:
    mode, file = sys.argv[1], sys.argv[2]
    records = load(file)
    if mode == "find":
        needles = json.load(sys.stdin)
        hits = [[n, p] for p, s in strings(records) for n in needles if n in s]
        print(json.dumps(hits))
    elif mode == "tokens":
        found = []
        for collection, id_field in _ID_FIELDS.items():
            for i, record in enumerate(records.get(collection) or []):
                rid = str(record.get(id_field)) if isinstance(record, dict) else ""
                found += [[p, s, rid] for p, s in strings(record, (collection, str(i)))
                          if s.startswith("ss1.")]
        print(json.dumps(found))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
