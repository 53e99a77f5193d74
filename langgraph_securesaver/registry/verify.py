"""Verifying the registry: the MAC of each thread row's retention fields before the pruner
acts on it, and ``verify_integrity`` -- every MACed row and every hash chain (receipts, events,
idempotency fingerprints), optionally against an anchor saved earlier.

A base class of :class:`~.core.Registry`; problems name a table and a row (ids,
positions, digests), never stored values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import TamperedDataError
from . import integrity as mac
from .base import RegistryBase
from .integrity import GENESIS, row_tag
from .schema import (
    ThreadRow,
    _policy_ref,
    _thread_ref,
    chain_heads,
    events,
    metadata,
    policies,
    receipts,
    threads,
)


@dataclass
class IntegrityReport:
    """What ``verify_integrity`` found. Problems name a table and a row (row ids, chain
    positions, digests of tenant/thread ids), never stored values."""

    checked: dict[str, int]
    problems: list[tuple[str, str, str]]          # (table, row, what is wrong)
    heads: list[dict[str, Any]]                   # anchor: the chain heads as verified

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked": self.checked,
                "problems": [{"table": t, "row": r, "problem": p} for t, r, p in self.problems],
                "anchor": {"format": "securesaver-chain-anchor/1", "heads": self.heads}}


class RegistryVerification(RegistryBase):
    """Verification of MACed rows and hash chains."""

    if TYPE_CHECKING:  # provided by Registry (declared for the type checker only)
        def key_row_problems(self, provider: Any) -> tuple[int, list[tuple[str, str, str]]]: ...

        def thread_key_problems(self, provider: Any
                                ) -> tuple[int, list[tuple[str, str, str]]]: ...

    # verification -------------------------------------------------------------------------------
    def verified_expiry(self, row: ThreadRow) -> float | None:
        """The expiry a thread row's MACed fields imply (None: held, or no TTL). Raises
        TamperedDataError naming the row when its MACs do not verify: the pruner acts on
        this value, never on the stored ``expires_at``."""
        integ = self._keyed()
        r = row.__dict__
        if not integ.check(row.policy_mac, mac.THREAD_POLICY, *mac.thread_policy_parts(r)):
            raise TamperedDataError(
                f"securesaver_threads row {_thread_ref(row.tenant, row.thread_id)}: its retention "
                "fields (TTLs, strategy, legal hold, created_at) do not verify; not obeyed")
        if not integ.check(row.activity_mac, mac.THREAD_ACTIVITY,
                           *mac.thread_activity_parts(r)):
            raise TamperedDataError(
                f"securesaver_threads row {_thread_ref(row.tenant, row.thread_id)}: its last "
                "activity does not verify; not obeyed")
        return mac.expiry_of(r)

    def verify_integrity(self, anchor: dict[str, Any] | None = None) -> IntegrityReport:
        """Check every MACed registry row and both hash chains (``securesaver events --verify``).

        ``anchor`` is the ``anchor`` of an earlier report (kept outside the database): each
        chain must still hold the rows it recorded, which detects deleting the newest rows of
        a chain together with restoring an older head."""
        integ = self._keyed()
        report = IntegrityReport({}, [], [])
        problem = report.problems.append
        with self.begin() as conn:
            for table, domain, parts in ((events, mac.EVENT, mac.event_parts),
                                         (receipts, mac.RECEIPT, mac.receipt_parts)):
                self._verify_chain(conn, table, domain, parts, report, anchor)
            n = 0
            for r in conn.execute(sa.select(threads)).mappings():
                n += 1
                ref = _thread_ref(r["tenant"], r["thread_id"])
                if not integ.check(r["policy_mac"], mac.THREAD_POLICY,
                                   *mac.thread_policy_parts(r)):
                    problem((threads.name, ref, "retention fields (TTLs, strategy, legal hold, "
                             "created_at) do not verify: altered, or inserted"))
                    continue
                if not integ.check(r["activity_mac"], mac.THREAD_ACTIVITY,
                                   *mac.thread_activity_parts(r)):
                    problem((threads.name, ref, "last_activity does not verify: altered"))
                    continue
                want, got = mac.expiry_of(r), r["expires_at"]
                if got is None and r["state"] == "pruned":
                    continue  # keep_latest clears the expiry until the next write
                # the SQL and Python compute the same IEEE sums: any difference is an edit
                if (want is None) != (got is None) or (
                        want is not None and abs(float(got) - want) > 1e-3):
                    problem((threads.name, ref, "expires_at does not match the thread's verified "
                             "TTLs (a forged expiry; the pruner ignores it)"))
            report.checked[threads.name] = n
            n = 0
            for r in conn.execute(sa.select(policies)).mappings():
                n += 1
                if not integ.check(r["mac"], mac.POLICY, *mac.policy_parts(r)):
                    problem((policies.name, _policy_ref(r["tenant"]),
                             "does not verify: altered, or inserted"))
            report.checked[policies.name] = n
            self._verify_idempotency(conn, report)
        if integ.provider is not None:
            n, found = self.key_row_problems(integ.provider)
            report.checked["securesaver_tenant_keys"] = n
            report.problems.extend(found)
            n, found = self.thread_key_problems(integ.provider)
            report.checked["securesaver_thread_keys"] = n
            report.problems.extend(found)
        return report

    def _verify_idempotency(self, conn: Connection, report: IntegrityReport) -> None:
        table = metadata.tables.get("securesaver_idempotency")
        if table is None or "fp_mac" not in table.c:
            return
        n = 0
        for r in conn.execute(sa.select(table.c.tenant, table.c.thread_id, table.c.key,
                                        table.c.fingerprint, table.c.fp_mac)):
            n += 1
            if not self.integrity.check(r.fp_mac, mac.IDEMPOTENCY, *mac.idempotency_parts(
                    r.tenant, r.thread_id, r.key, r.fingerprint)):
                report.problems.append((table.name, f"{_thread_ref(r.tenant, r.thread_id)} "
                                        f"key={str(r.key)[:16]}", "the argument fingerprint "
                                        "does not verify: altered, or inserted"))
        report.checked[table.name] = n

    def _verify_chain(self, conn: Connection, table: sa.Table, domain: str, parts: Any,
                      report: IntegrityReport, anchor: dict[str, Any] | None) -> None:
        integ = self.integrity
        problem = report.problems.append
        chains: dict[str, list[dict[str, Any]]] = {}
        n = 0
        for r in conn.execute(sa.select(table).order_by(table.c.id)).mappings():
            n += 1
            row = dict(r)
            if row["mac"] is None or row["seq"] is None:
                problem((table.name, f"id={row['id']}", "has no MAC: written without the "
                         "registry key (an older version, or inserted directly)"))
                continue
            if not integ.check(row["mac"], domain, *parts(row)):
                problem((table.name, f"id={row['id']} seq={row['seq']}",
                         "altered: its MAC does not verify"))
            chains.setdefault(row["tenant"] or "", []).append(row)
        report.checked[table.name] = n
        heads = {h.chain: h for h in conn.execute(
            sa.select(chain_heads).where(chain_heads.c.tbl == table.name))}
        anchored = {(a.get("table"), a.get("chain")): a
                    for a in (anchor or {}).get("heads", []) if isinstance(a, dict)}
        for chain in sorted(set(chains) | set(heads)):
            tag = row_tag(chain)
            rows = sorted(chains.get(chain, []), key=lambda x: int(x["seq"]))
            by_seq = {int(x["seq"]): x for x in rows}
            expect_seq, expect_prev = 1, GENESIS
            for row in rows:
                seq = int(row["seq"])
                ref = f"id={row['id']} seq={seq}"
                if seq < expect_seq:
                    problem((table.name, ref, "a second row holds this chain position (a copy, "
                             "or a reordered row)"))
                    continue
                if seq > expect_seq:
                    problem((table.name, ref, f"{seq - expect_seq} row(s) before it in the "
                             "chain are missing (deleted)"))
                elif row["prev_mac"] != expect_prev:
                    problem((table.name, ref, "appended after a chain head that did not verify"
                             if str(row["prev_mac"]).startswith("!") else
                             "does not follow the previous row (reordered, replaced or moved)"))
                expect_seq, expect_prev = seq + 1, str(row["mac"])
            last = expect_seq - 1
            head = heads.get(chain)
            where = f"chain#{tag}"
            if head is None:
                if rows:
                    problem((chain_heads.name, f"{table.name} {where}", "the chain head is "
                             "missing (deleted)"))
            elif not integ.check(head.head_mac, mac.HEAD,
                                 *mac.head_parts(table.name, chain, int(head.seq), head.mac)):
                problem((chain_heads.name, f"{table.name} {where}", "the chain head does not "
                         "verify: altered"))
            elif int(head.seq) > last:
                problem((table.name, where, f"the newest {int(head.seq) - last} row(s) of the "
                         "chain are missing (deleted)"))
            elif int(head.seq) < last or head.mac != expect_prev:
                problem((chain_heads.name, f"{table.name} {where}", "the chain head is behind "
                         "its rows (restored from an older copy)"))
            else:
                report.heads.append({"table": table.name, "chain": tag, "seq": last,
                                     "mac": expect_prev})
            mark = anchored.pop((table.name, tag), None)
            if mark is not None:
                kept = by_seq.get(int(mark.get("seq", 0)))
                if kept is None or kept["mac"] != mark.get("mac"):
                    problem((table.name, f"{where} seq={mark.get('seq')}", "the anchored row is "
                             "gone or changed: rows were deleted or the chain rewritten since "
                             "the anchor was taken"))
        for (tbl, gone), mark in anchored.items():
            if tbl == table.name:
                problem((table.name, f"chain#{gone} seq={mark.get('seq')}", "the anchored chain "
                         "is gone: every row of it was deleted since the anchor was taken"))
