"""The delta-history walk refuses an edited row as the read of that row refuses it: one
TamperedDataError naming the row, the same words, sync and async, SQLite and PostgreSQL,
however the walk reached the row (its target, a parent fetched by id, a row of its paged
listing), and a stored payload is never evaluated."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError

from .boundary_helpers import Raw, constructor_payload, inner_id, json_constructor
from .test_delta_channel import _out_of_order_thread

THREAD = "o"  # root 9 -> 5 -> 7 -> 1: the walk from 1 fetches 7 and 9 by id and lists 5
CHANNELS = ["items"]


def _conf(cid: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": THREAD, "tenant_id": "acme", "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


# each edit: (raw, victim checkpoint id, marker file a payload would create) -> None
def _garbage_body(raw: Raw, cid: str, marker: Path) -> None:
    if raw.backend == "sqlite":
        value: Any = b"\xc1 not msgpack"
        sql = "UPDATE checkpoints SET checkpoint = ? WHERE thread_id = ? AND checkpoint_id = ?"
    else:
        value = json.dumps("not a checkpoint")
        sql = ("UPDATE checkpoints SET checkpoint = ?::jsonb WHERE thread_id = ? AND "
               "checkpoint_id = ?")
    assert raw.run(sql, value, inner_id(THREAD), cid) == 1


def _payload_body(raw: Raw, cid: str, marker: Path) -> None:
    if raw.backend == "sqlite":
        assert raw.run("UPDATE checkpoints SET type = 'msgpack', checkpoint = ? WHERE "
                       "thread_id = ? AND checkpoint_id = ?", constructor_payload(marker),
                       inner_id(THREAD), cid) == 1
    else:  # a value inlined in the checkpoint JSONB
        assert raw.run("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, "
                       "'{channel_values,injected}', ?::jsonb) WHERE thread_id = ? AND "
                       "checkpoint_id = ?", json.dumps(json_constructor(marker)),
                       inner_id(THREAD), cid) == 1


def _metadata_unparsable(raw: Raw, cid: str, marker: Path) -> None:
    # SQLite stores JSON text (now broken); PostgreSQL's JSONB takes only JSON (now a list)
    value = b"{not json" if raw.backend == "sqlite" else "[1]"
    cast = "" if raw.backend == "sqlite" else "::jsonb"
    assert raw.run(f"UPDATE checkpoints SET metadata = ?{cast} WHERE thread_id = ? AND "
                   "checkpoint_id = ?", value, inner_id(THREAD), cid) == 1


def _metadata_altered(raw: Raw, cid: str, marker: Path) -> None:
    md = raw.metadata(THREAD, cid)
    md["step"] = 99
    raw.set_metadata(THREAD, cid, md)


def _write_ciphertext_copied(raw: Raw, cid: str, marker: Path) -> None:
    """The victim's sealed write gets the root's ciphertext (same channel, other checkpoint)."""
    ((*_, value),) = raw.write_rows(THREAD, "9")
    assert raw.run(f"UPDATE {raw.writes} SET {raw.value_col} = ? WHERE thread_id = ? AND "
                   "checkpoint_id = ?", value, inner_id(THREAD), cid) == 1


EDITS: dict[str, Callable[[Raw, str, Path], None]] = {
    "garbage_body": _garbage_body, "payload_body": _payload_body,
    "metadata_unparsable": _metadata_unparsable, "metadata_altered": _metadata_altered,
    "write_ciphertext_copied": _write_ciphertext_copied,
}
# how the walk meets each victim, and the read that refuses the same row on its own: the
# target and a parent fetched by id are looked up as get_tuple does; a row of the walk's
# listing is met as list() meets it (a row that does not parse is named by its position)
VICTIMS = {"target": "1", "fetched_parent": "7", "listed": "5"}


def _same_refusal(walked: str, alone: str, victim: str) -> None:
    """Word for word, except where a listed row that does not parse is placed: the walk's
    page starts after checkpoint 7, and PostgresSaver parses a whole listing before its first
    row (so list() places it before the first row)."""
    if walked == alone:
        return
    assert victim == "listed" and " listed after " in alone, (walked, alone)
    assert walked.split(" listed after ")[0] == alone.split(" listed after ")[0]
    assert walked.split(" was refused: ")[1] == alone.split(" was refused: ")[1]


def _names_the_row(refusal: str, cid: str, victim: str) -> None:
    """The row by its id, or (a listed row that does not parse) by the row listed before it."""
    if f"checkpoint '{cid}'" in refusal:
        assert f"thread {THREAD!r}" in refusal or f"thread {inner_id(THREAD)!r}" in refusal
        return
    assert victim == "listed", refusal
    assert f"listed after thread {inner_id(THREAD)!r} namespace '' checkpoint '7'" in refusal


def _refusal(read: Callable[[], Any]) -> str:
    with pytest.raises(TamperedDataError) as refused:
        read()
    return str(refused.value)


async def _arefusal(read: Callable[[], Any]) -> str:
    with pytest.raises(TamperedDataError) as refused:
        await read()
    return str(refused.value)


@pytest.mark.parametrize("victim", sorted(VICTIMS))
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_delta_walk_refuses_an_edited_row_as_its_read_does(database, edit: str, victim: str,
                                                           tmp_path: Path) -> None:
    url, raw = database
    ring = Keyring.generate()
    marker = tmp_path / "PWNED"
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        target = _out_of_order_thread(saver, lambda i: [f"w{i}"])
        assert saver.get_delta_channel_history(config=target, channels=CHANNELS)["items"][
            "seed"] == ["seed"]
    cid = VICTIMS[victim]
    EDITS[edit](raw, cid, marker)

    def alone(saver: SecureSaver) -> Any:
        if victim == "listed":
            return lambda: list(saver.list(_conf()))
        return lambda: saver.get_tuple(_conf(cid))

    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        expected = _refusal(alone(saver))
        walked = _refusal(lambda: saver.get_delta_channel_history(config=target,
                                                                  channels=CHANNELS))
    _same_refusal(walked, expected, victim)
    _names_the_row(walked, cid, victim)
    assert str(marker) not in walked and not marker.exists()

    async def aread() -> tuple[str, str]:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            async def alone() -> Any:
                if victim == "listed":
                    return [t async for t in asaver.alist(_conf())]
                return await asaver.aget_tuple(_conf(cid))
            return await _arefusal(alone), await _arefusal(
                lambda: asaver.aget_delta_channel_history(config=target, channels=CHANNELS))

    aexpected, awalked = asyncio.run(aread())
    _same_refusal(awalked, aexpected, victim)
    _names_the_row(awalked, cid, victim)
    assert not marker.exists(), "a stored payload was evaluated"


def test_delta_walk_of_a_tenant_without_keys_is_refused_as_get_tuple_is(database) -> None:
    """The tenant's key rows are gone (a shredded tenant, or a registry that is not this
    database's) but its rows are still stored: get_tuple refuses the target, so the walk must
    refuse it too; an empty history would pass for "this channel was never written"."""
    url, raw = database
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        target = _out_of_order_thread(saver, lambda i: [f"w{i}"])
        other = saver.put({"configurable": {"thread_id": "x", "tenant_id": "beta",
                                            "checkpoint_ns": ""}},
                          empty_checkpoint(), {"step": 0}, {})
    assert raw.run("DELETE FROM securesaver_tenant_keys WHERE tenant = ?", "acme") > 0
    missing = {"configurable": {**target["configurable"], "thread_id": "nothing-here"}}

    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        expected = _refusal(lambda: saver.get_tuple(target))
        assert "no data keys" in expected
        assert _refusal(lambda: saver.get_delta_channel_history(
            config=target, channels=CHANNELS)) == expected
        # no row, nothing to refuse (as get_tuple returns None); another tenant is unaffected
        assert saver.get_tuple(missing) is None
        assert saver.get_delta_channel_history(config=missing, channels=CHANNELS) == {
            "items": {"writes": []}}
        assert saver.get_delta_channel_history(config=other, channels=CHANNELS) == {
            "items": {"writes": []}}

    async def aread() -> tuple[str, str, Any, Any]:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            assert await asaver.aget_tuple(missing) is None
            return (await _arefusal(lambda: asaver.aget_tuple(target)),
                    await _arefusal(lambda: asaver.aget_delta_channel_history(
                        config=target, channels=CHANNELS)),
                    await asaver.aget_delta_channel_history(config=missing, channels=CHANNELS),
                    await asaver.aget_delta_channel_history(config=other, channels=CHANNELS))

    aexpected, awalked, amissing, aother = asyncio.run(aread())
    assert aexpected == expected and awalked == expected
    assert amissing == aother == {"items": {"writes": []}}
