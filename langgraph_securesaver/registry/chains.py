"""Receipts and audit events: the registry's append-only rows, each appended to its tenant's
hash chain (sequence number, previous MAC, MAC) under a locked chain head, so a deleted,
reordered or inserted row breaks the chain ``events --verify`` walks.

A base class of :class:`~.core.Registry` (it uses the registry's engine, transactions and
integrity helper); verifying the chains is :mod:`.verify`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import ConfigurationError
from . import integrity as mac
from .base import RegistryBase
from .dialects import upsert_returning
from .integrity import GENESIS, RegistryIntegrity, row_tag
from .schema import Event, Receipt, chain_heads, events, receipts

logger = logging.getLogger("langgraph_securesaver.registry.core")


class RegistryChains(RegistryBase):
    """Receipts and events, written to per-tenant hash chains and listed back."""

    # receipts ---------------------------------------------------------------------------------
    def _insert_receipt(self, conn: Connection, receipt: dict[str, Any]) -> None:
        self.insert_receipts(conn, [receipt])

    def insert_receipts(self, conn: Connection, batch: Sequence[dict[str, Any]]) -> None:
        """Every receipt is written here, inside the caller's transaction: one chain step per
        tenant and one statement for a whole batch (the pruner writes hundreds at once).

        The per-tenant chain heads are locked (and advanced) here, so call this as the LAST
        statement before the commit: concurrent pruners then hold a head only for the insert
        and the commit. Call ``_keyed()`` before opening the transaction."""
        if not batch:
            return
        now = time.time()
        rows = []
        for receipt in batch:
            fields = dict(receipt)
            detail = fields.pop("detail", {})
            rows.append({"receipt_id": uuid.uuid4().hex, "deleted_at": now,
                         "thread_id": None, "requested_by": None, **fields,
                         "detail": json.dumps(detail, default=str, sort_keys=True)})
        names = [c.name for c in receipts.columns if c.name != "id"]
        extra = {k for r in rows for k in r} - set(names)
        if extra:
            raise ConfigurationError(f"unknown receipt fields {sorted(extra)}")
        self._chain(conn, receipts, rows)  # gives each row seq, prev_mac and mac
        if self.dialect == "postgresql" and len(rows) > 1:
            # one statement, one array parameter per column (not 12 parameters per receipt);
            # unnest keeps the order, so ids follow the chain order within a batch
            from sqlalchemy.dialects.postgresql import ARRAY
            arrays = [sa.literal([r.get(n) for r in rows], ARRAY(receipts.c[n].type))
                      for n in names]
            conn.execute(receipts.insert().from_select(
                names, sa.select(*[sa.func.unnest(a) for a in arrays])))
            return
        conn.execute(receipts.insert(), rows)

    def add_receipt(self, **receipt: Any) -> None:
        self.add_receipts([receipt])

    def add_receipts(self, batch: Sequence[dict[str, Any]]) -> None:
        """Write several receipts in one transaction (each a dict like add_receipt's kwargs)."""
        if not batch:
            return
        self._keyed()
        with self.begin() as conn:
            self.insert_receipts(conn, batch)

    # hash chains ------------------------------------------------------------------------------
    def _keyed(self) -> RegistryIntegrity:
        """The integrity helper with its key loaded (before a transaction is opened: loading
        may create the key row, which must not wait on our own write lock)."""
        self.integrity.require()
        return self.integrity

    def _append_chained(self, conn: Connection, table: sa.Table,
                        rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._chain(conn, table, rows)
        conn.execute(table.insert(), rows)

    def _chain(self, conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """Give ``rows`` (in order) their chain position, previous MAC and MAC, per tenant.

        The chain head rows are the lock: an upsert (a no-op update when the head exists)
        returns them, taking the database write lock on SQLite before anything is read and the
        heads' row locks on PostgreSQL until commit. Heads are locked in sorted chain order, so
        concurrent batches cannot deadlock on each other; appends to one chain are serialized,
        so each chain's order is total (``seq``) whatever the number of writers. On
        PostgreSQL a batch's heads are locked and advanced with one statement each (not two
        per tenant)."""
        integ = self.integrity
        domain, parts = ((mac.EVENT, mac.event_parts) if table is events
                         else (mac.RECEIPT, mac.receipt_parts))
        by_chain: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_chain.setdefault(row.get("tenant") or "", []).append(row)
        chains = sorted(by_chain)
        heads = self._lock_heads(conn, table.name, chains)
        advanced: list[tuple[str, int, str, str]] = []
        for chain in chains:
            seq, prev, head_mac = heads[chain]
            if not integ.check(head_mac, mac.HEAD,
                               *mac.head_parts(table.name, chain, seq, prev)):
                # never build on a forged head (it could hide deleted rows): the next row
                # carries a marked prev_mac, so `events --verify` reports the break there
                logger.error("the chain head of %s chain %s does not verify", table.name,
                             row_tag(chain))
                prev = "!" + prev[:63]
            for row in by_chain[chain]:
                seq += 1
                row["seq"], row["prev_mac"] = seq, prev
                row["mac"] = prev = integ.mac(domain, *parts(row))
            advanced.append((chain, seq, prev, integ.mac(
                mac.HEAD, *mac.head_parts(table.name, chain, seq, prev))))
        self._store_heads(conn, table.name, advanced)

    def _lock_heads(self, conn: Connection, tbl: str, chains: list[str]
                    ) -> dict[str, tuple[int, str, str]]:
        """Lock (creating at position 0 when missing) the heads of ``chains`` (sorted);
        returns chain -> (seq, mac, head_mac) as committed by the previous appender."""
        integ = self.integrity
        genesis = [integ.mac(mac.HEAD, *mac.head_parts(tbl, c, 0, GENESIS)) for c in chains]
        found: dict[str, tuple[int, str, str]] = {}
        if self.dialect == "postgresql" and len(chains) > 1:
            result = conn.execute(sa.text(
                "INSERT INTO securesaver_chain_heads (tbl, chain, seq, mac, head_mac) "
                "SELECT :tbl, u.c, 0, '', u.h FROM unnest(CAST(:chains AS text[]), "
                "CAST(:genesis AS text[])) AS u(c, h) ORDER BY u.c "
                "ON CONFLICT (tbl, chain) DO UPDATE SET seq = securesaver_chain_heads.seq "
                "RETURNING chain, seq, mac, head_mac"),
                {"tbl": tbl, "chains": chains, "genesis": genesis})
            for chain, seq, prev, head_mac in result:
                found[chain] = (int(seq), str(prev), str(head_mac))
            return found
        for chain, first in zip(chains, genesis, strict=True):
            head = upsert_returning(
                conn, self.dialect, chain_heads,
                {"tbl": tbl, "chain": chain, "seq": 0, "mac": GENESIS, "head_mac": first},
                [chain_heads.c.tbl, chain_heads.c.chain], lambda new: {"seq": chain_heads.c.seq},
                [chain_heads.c.seq, chain_heads.c.mac, chain_heads.c.head_mac])
            found[chain] = (int(head["seq"]), str(head["mac"]), str(head["head_mac"]))
        return found

    def _store_heads(self, conn: Connection, tbl: str,
                     heads: list[tuple[str, int, str, str]]) -> None:
        if self.dialect == "postgresql" and len(heads) > 1:
            conn.execute(sa.text(
                "UPDATE securesaver_chain_heads h SET seq = u.s, mac = u.m, head_mac = u.hm "
                "FROM unnest(CAST(:chains AS text[]), CAST(:seqs AS bigint[]), "
                "CAST(:macs AS text[]), CAST(:hmacs AS text[])) AS u(c, s, m, hm) "
                "WHERE h.tbl = :tbl AND h.chain = u.c"),
                {"tbl": tbl, "chains": [h[0] for h in heads], "seqs": [h[1] for h in heads],
                 "macs": [h[2] for h in heads], "hmacs": [h[3] for h in heads]})
            return
        for chain, seq, last, head_mac in heads:
            conn.execute(chain_heads.update().where(
                chain_heads.c.tbl == tbl, chain_heads.c.chain == chain).values(
                seq=seq, mac=last, head_mac=head_mac))

    @staticmethod
    def _receipts_where(q: Any, tenant: str | None, thread_id: str | None,
                        since: float | None, until: float | None) -> Any:
        if tenant is not None:
            q = q.where(receipts.c.tenant == tenant)
        if thread_id is not None:
            q = q.where(receipts.c.thread_id == thread_id)
        if since is not None:
            q = q.where(receipts.c.deleted_at >= since)
        if until is not None:
            q = q.where(receipts.c.deleted_at < until)
        return q

    def list_receipts(self, *, tenant: str | None = None, thread_id: str | None = None,
                      since: float | None = None, until: float | None = None,
                      newest: int | None = None) -> list[Receipt]:
        """Receipts in insertion order; ``newest``: only the latest that many by deletion
        time (still oldest first), read as such (a report of a busy period stays small)."""
        q = self._receipts_where(sa.select(receipts), tenant, thread_id, since, until)
        q = q.order_by(receipts.c.id) if newest is None else q.order_by(
            receipts.c.deleted_at.desc(), receipts.c.receipt_id.desc()).limit(newest)
        with self.begin() as conn:
            out = [Receipt(r["receipt_id"], r["tenant"], r["thread_id"], r["deleted_at"],
                           r["action"], r["reason"], r["requested_by"],
                           json.loads(r["detail"] or "{}")) for r in conn.execute(q).mappings()]
        return out if newest is None else out[::-1]

    def count_receipts(self, *, tenant: str | None = None, thread_id: str | None = None,
                       since: float | None = None, until: float | None = None) -> int:
        q = self._receipts_where(sa.select(sa.func.count()).select_from(receipts), tenant,
                                 thread_id, since, until)
        with self.begin() as conn:
            return int(conn.execute(q).scalar() or 0)

    # events -----------------------------------------------------------------------------------
    def record_event(self, kind: str, *, tenant: str | None = None, thread_id: str | None = None,
                     actor: str | None = None, **detail: Any) -> None:
        self._keyed()
        with self.begin() as conn:
            self._append_chained(conn, events, [{
                "at": time.time(), "kind": kind, "tenant": tenant, "thread_id": thread_id,
                "actor": actor, "detail": json.dumps(detail, default=str, sort_keys=True)}])

    @staticmethod
    def _events_where(q: Any, kind: str | None, tenant: str | None, thread_id: str | None,
                      since: float | None, until: float | None) -> Any:
        for col, val in ((events.c.kind, kind), (events.c.tenant, tenant),
                         (events.c.thread_id, thread_id)):
            if val is not None:
                q = q.where(col == val)
        if since is not None:
            q = q.where(events.c.at >= since)
        if until is not None:
            q = q.where(events.c.at < until)
        return q

    def list_events(self, *, kind: str | None = None, tenant: str | None = None,
                    thread_id: str | None = None, since: float | None = None,
                    until: float | None = None, limit: int | None = None,
                    newest: int | None = None) -> list[Event]:
        """Events in insertion order (``limit``: the first that many); ``newest``: only the
        latest that many by time (still oldest first)."""
        q = self._events_where(sa.select(events), kind, tenant, thread_id, since, until)
        q = q.order_by(events.c.id) if newest is None else q.order_by(
            events.c.at.desc(), events.c.id.desc()).limit(newest)
        if limit is not None:
            q = q.limit(limit)
        with self.begin() as conn:
            out = [Event(r["id"], r["at"], r["kind"], r["tenant"], r["thread_id"], r["actor"],
                         json.loads(r["detail"] or "{}")) for r in conn.execute(q).mappings()]
        return out if newest is None else out[::-1]

    def count_events(self, *, kind: str | None = None, tenant: str | None = None,
                     thread_id: str | None = None, since: float | None = None,
                     until: float | None = None) -> int:
        q = self._events_where(sa.select(sa.func.count()).select_from(events), kind, tenant,
                               thread_id, since, until)
        with self.begin() as conn:
            return int(conn.execute(q).scalar() or 0)
