"""The in-memory saver's native operations: ``InMemorySaver`` keeps its checkpoints, blobs
and writes in dictionaries, so each operation edits them in one synchronous step (and drops
the blobs no remaining checkpoint references).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from ..errors import DeltaChannelPruneError
from .ops import DELTA_METADATA_KEYS, StorageOps


class MemoryOps(StorageOps):
    """InMemorySaver: its dictionaries are its storage; each operation is one synchronous step."""

    inner: InMemorySaver

    def _delete_checkpoints(self, thread_id: str, ns: str, ids: Sequence[str]) -> None:
        by_ns = self.inner.storage.get(thread_id, {})
        for cid in ids:
            by_ns.get(ns, {}).pop(cid, None)
            self.inner.writes.pop((thread_id, ns, cid), None)
        self._collect_blobs(thread_id, ns)

    def _collect_blobs(self, thread_id: str, ns: str) -> None:
        serde = self.inner.serde
        referenced: set[tuple[str, Any]] = set()
        for saved, _md, _parent in self.inner.storage.get(thread_id, {}).get(ns, {}).values():
            for ch, ver in serde.loads_typed(saved).get("channel_versions", {}).items():
                referenced.add((ch, ver))
        for key in [k for k in self.inner.blobs if k[0] == thread_id and k[1] == ns]:
            if (key[2], key[3]) not in referenced:
                del self.inner.blobs[key]

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        serde = self.inner.serde
        for tid in inner_ids:
            namespaces = self.inner.storage.get(tid, {})
            for by_id in namespaces.values():
                for _saved, md, _parent in by_id.values():
                    if any(k in serde.loads_typed(md) for k in DELTA_METADATA_KEYS):
                        raise DeltaChannelPruneError(
                            f"thread {tid!r} uses a DeltaChannel; keep_latest refused"
                        )
            for ns, by_id in list(namespaces.items()):
                if not by_id:
                    continue
                head = max(by_id)
                saved, md, _parent = by_id[head]
                by_id[head] = (saved, md, None)
                self._delete_checkpoints(tid, ns, [c for c in by_id if c != head])

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        self.keep_latest(inner_ids)

    def count_checkpoints(self, inner_id: str) -> int:
        return sum(len(by_id) for by_id in self.inner.storage.get(inner_id, {}).values())

    def thread_ids(self, prefix: str) -> list[str] | None:
        # the dict's keys only: other tenants' checkpoints are never decoded
        return sorted(t for t in list(self.inner.storage) if t.startswith(prefix))

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        wanted = set(run_ids)
        serde = self.inner.serde
        touched: set[str] = set()
        for tid, namespaces in list(self.inner.storage.items()):
            if not tid.startswith(prefix):
                continue
            for ns, by_id in list(namespaces.items()):
                doomed = [cid for cid, (_s, md, _p) in by_id.items()
                          if serde.loads_typed(md).get("run_id") in wanted]
                if doomed:
                    self._delete_checkpoints(tid, ns, doomed)
                    touched.add(tid)
        return touched

    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        return self.delete_for_runs(prefix, run_ids)
