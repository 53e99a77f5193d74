"""The receipt and event hash chains as signed documents carry them, and their offline check.

Every receipt and event row holds its chain position (``seq``, per tenant; ``""`` for rows of
no tenant), the MAC of the previous row and its own MAC (:mod:`..registry.chains`). Signed
documents copy those three fields into each entry as ``"chain": {"table", "chain", "seq",
"prev_mac", "mac"}``. The MACs are keyed, so an auditor cannot recompute them; what the
public key lets them check is the *links*: entry ``n`` names the MAC of entry ``n - 1``. A
receipt removed from a set of signed documents -- or from the database before a listing was
signed -- leaves a position missing and a link broken (:func:`check`); rewriting the chain
around the gap needs the registry MAC key, which only the keyring unwraps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from ..registry.integrity import GENESIS
from ..registry.schema import chain_heads, events, receipts
from ..timeargs import iso

_CHUNK = 500


def _chain(table: sa.Table, row: Any) -> dict[str, Any]:
    return {"table": table.name, "chain": row["tenant"] or "", "seq": row["seq"],
            "prev_mac": row["prev_mac"], "mac": row["mac"]}


def receipt_entry(row: Any) -> dict[str, Any]:
    """A receipt row as signed documents hold it (counts and ids, never content)."""
    return {"receipt_id": row["receipt_id"], "tenant": row["tenant"],
            "thread_id": row["thread_id"], "deleted_at": iso(row["deleted_at"]),
            "action": row["action"], "reason": row["reason"],
            "requested_by": row["requested_by"], "detail": json.loads(row["detail"] or "{}"),
            "chain": _chain(receipts, row)}


def _ordered(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["chain"]["chain"], r["chain"]["seq"] or 0))


def receipts_by_id(registry: Any, ids: Sequence[str]) -> list[dict[str, Any]]:
    """The receipts with these ids, in chain order."""
    out: list[dict[str, Any]] = []
    with registry.begin() as conn:
        for start in range(0, len(ids), _CHUNK):
            out.extend(receipt_entry(r) for r in conn.execute(sa.select(receipts).where(
                receipts.c.receipt_id.in_(list(ids[start:start + _CHUNK])))).mappings())
    return _ordered(out)


def receipts_between(registry: Any, since: float, until: float) -> list[dict[str, Any]]:
    """Every receipt written in [since, until], in chain order (what a prune sweep wrote,
    with whatever else was deleted meanwhile)."""
    with registry.begin() as conn:
        return _ordered(receipt_entry(r) for r in conn.execute(sa.select(receipts).where(
            receipts.c.deleted_at >= since, receipts.c.deleted_at <= until)).mappings())


def receipts_of_threads(registry: Any, tenant: str, thread_ids: Sequence[str]
                        ) -> list[dict[str, Any]]:
    """The receipts naming these threads of ``tenant`` (a subject export's)."""
    out: list[dict[str, Any]] = []
    with registry.begin() as conn:
        for start in range(0, len(thread_ids), _CHUNK):
            out.extend(receipt_entry(r) for r in conn.execute(sa.select(receipts).where(
                receipts.c.tenant == tenant,
                receipts.c.thread_id.in_(list(thread_ids[start:start + _CHUNK])))).mappings())
    return _ordered(out)


def trail_entries(registry: Any, entries: Sequence[Any]) -> list[dict[str, Any]]:
    """``events``' entries (:class:`..audit.trail.TrailEntry`) as dicts, each with its chain
    position (looked up by id: the listing's filters stay the trail's own)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    wanted = {"event": [int(e.ref) for e in entries if e.source == "event"],
              "receipt": [e.ref for e in entries if e.source == "receipt"]}
    with registry.begin() as conn:
        for source, table, column in (("event", events, events.c.id),
                                      ("receipt", receipts, receipts.c.receipt_id)):
            refs = wanted[source]
            for start in range(0, len(refs), _CHUNK):
                for r in conn.execute(sa.select(table).where(
                        column.in_(refs[start:start + _CHUNK]))).mappings():
                    ref = str(r["id"] if source == "event" else r["receipt_id"])
                    found[(source, ref)] = _chain(table, r)
    return [{**e.as_dict(), "chain": found.get((e.source, e.ref))} for e in entries]


def heads(registry: Any) -> list[dict[str, Any]]:
    """Every chain's head (its newest position and MAC) as the registry holds it now."""
    with registry.begin() as conn:
        return [{"table": h.tbl, "chain": h.chain, "seq": int(h.seq), "mac": h.mac}
                for h in conn.execute(sa.select(chain_heads).order_by(
                    chain_heads.c.tbl, chain_heads.c.chain))]


# --- the offline check ---------------------------------------------------------------------
def chained(document: Any) -> Iterator[dict[str, Any]]:
    """The entries of a document that carry a chain position (in lists at its top level, or
    one level down: ``{"report": ..., "receipts": [...]}``)."""
    if not isinstance(document, dict):
        return
    for value in document.values():
        items = value if isinstance(value, list) else (
            [v for inner in value.values() if isinstance(inner, list) for v in inner]
            if isinstance(value, dict) else [])
        for item in items:
            if isinstance(item, dict) and _position(item.get("chain")) is not None:
                yield item


def _position(chain: Any) -> tuple[str, str, int, str, str] | None:
    if not isinstance(chain, dict):
        return None
    table, name, seq = chain.get("table"), chain.get("chain"), chain.get("seq")
    prev, mac = chain.get("prev_mac"), chain.get("mac")
    if not (isinstance(table, str) and isinstance(name, str) and type(seq) is int
            and isinstance(prev, str) and isinstance(mac, str)):
        return None
    return table, name, seq, prev, mac


def check(documents: Sequence[Any], *, whole: bool) -> list[str]:
    """Problems of the chains the documents hold together. Always: no position holds two
    different entries, and each entry follows the one before it when both are present.
    ``whole`` (the documents claim to hold every entry of their chains): no position is
    missing from 1 to the newest, and the newest is the head a document recorded."""
    at: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
    problems: list[str] = []
    recorded: dict[tuple[str, str], tuple[int, str]] = {}
    for doc in documents:
        for entry in chained(doc):
            table, name, seq, prev, mac = _position(entry["chain"])  # type: ignore[misc]
            # the MAC covers the row: one position, one MAC (documents shape entries apart)
            seen = at.setdefault((table, name), {}).get(seq)
            if seen is not None and seen != (prev, mac):
                problems.append(f"{_name(table, name)} position {seq}: two different entries")
            at[(table, name)][seq] = (prev, mac)
        for head in (doc.get("chain_heads") or []) if isinstance(doc, dict) else []:
            if isinstance(head, dict) and type(head.get("seq")) is int:
                recorded[(str(head.get("table")), str(head.get("chain")))] = (
                    head["seq"], str(head.get("mac")))
    for (table, name), positions in sorted(at.items()):
        where = _name(table, name)
        order = sorted(positions)
        for seq in order:
            prev = positions[seq][0]
            before = positions.get(seq - 1)
            if before is not None and prev != before[1]:
                problems.append(f"{where} position {seq} does not follow position {seq - 1}")
            if whole and seq == 1 and prev != GENESIS:
                problems.append(f"{where} position 1 is not the start of the chain")
        if not whole:
            continue
        expected = 1
        for seq in order:
            if seq > expected:
                problems.append(f"{where} positions {_span(expected, seq - 1)} are missing "
                                "(removed from the chain, or not among the files)")
            expected = seq + 1
        # the head was read before the entries: entries newer than it are fine
        head = recorded.pop((table, name), None)
        if head is not None and head[0] > order[-1]:
            problems.append(f"{where} ends at position {order[-1]} but its head was at "
                            f"position {head[0]}: the newest entries are missing")
        elif head is not None and head[0] in positions and positions[head[0]][1] != head[1]:
            problems.append(f"{where} position {head[0]} is not the entry its head recorded")
    if whole:
        for (table, name), (seq, _mac) in sorted(recorded.items()):
            if seq > 0 and any(t == table for t, _n in at):
                problems.append(f"{_name(table, name)}: all {seq} entries are missing")
    return problems


def _name(table: str, chain: str) -> str:
    kind = "receipt" if table == receipts.name else "event" if table == events.name else table
    return f"the {kind} chain of " + (f"tenant {chain!r}" if chain else "no tenant")


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"
