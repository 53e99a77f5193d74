"""Who holds a claim, and whether that holder is still alive.

Every claim records its holder: a host id, the process id and the process start time, a
per-process random id, and on PostgreSQL the key of a session advisory lock the holder's store
keeps for as long as its process (and database session) lives. When a duplicate finds the key in
progress it decides, in this order:

1. the holder is this very process (same host id, pid and random id): alive while the claim is
   still registered as running here (an unfinished claim left behind by this process is dead);
2. the holder ran on this host (same host id: same kernel boot AND same pid namespace, so its
   pid is meaningful here): alive iff a process with that pid exists, is not a zombie and has
   the recorded start time (a reused pid has another start time);
3. on PostgreSQL, the holder's session lock: if this worker can take the lock, the holder's
   database session is gone (the server drops session locks when the connection dies), so
   the holder is dead;
4. otherwise nothing is known: the lease decides (heartbeats renew it while the holder lives).

A dead holder's claim is taken over at once (fencing token + 1, same key); a live or unknown one
is waited for. The decision never needs a worker's wall clock: process start times are kernel
clock ticks since boot, leases are compared on the database clock.

The holder columns are hints written by workers; a forged or missing value can only make a claim
look dead (it is taken over with a NEW fencing token, so the stale holder cannot complete) or
unknown (the lease decides). Two executions never run with the same fencing token.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

Liveness = Literal["alive", "dead", "unknown"]

#: pids above this are not valid on Linux (PID_MAX_LIMIT is 2**22)
_PID_MAX = 1 << 22


@dataclass(frozen=True)
class Holder:
    """The identity a worker writes on its claims."""

    host_id: str | None
    pid: int
    start: int | None
    nonce: str


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is [0], starttime [19])."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    end = raw.rfind(")")
    if end < 0:
        return None
    fields = raw[end + 1:].split()
    return fields if len(fields) >= 20 else None


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), or None."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def _compute_host_id() -> str | None:
    """An id shared by exactly the processes whose pids this process can check: the kernel
    boot id plus the pid namespace. None where that cannot be established (non-Linux, no
    /proc, or a /proc that belongs to another pid namespace)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    if not boot:
        return None
    try:
        ns = os.stat("/proc/self/ns/pid")
        self_link = os.readlink("/proc/self")
    except OSError:
        return None
    if self_link != str(os.getpid()):  # /proc is mounted from another pid namespace
        return None
    digest = hashlib.sha256(f"{boot.strip()}:{ns.st_dev}:{ns.st_ino}".encode()).hexdigest()
    return digest[:32]


_holder_lock = threading.Lock()
_holder: Holder | None = None


def current_holder() -> Holder:
    """This process's identity (recomputed after a fork: new pid, new random id)."""
    global _holder
    pid = os.getpid()
    holder = _holder
    if holder is not None and holder.pid == pid:
        return holder
    with _holder_lock:
        if _holder is None or _holder.pid != pid:
            _holder = Holder(_compute_host_id(), pid, process_start(pid), secrets.token_hex(16))
        return _holder


# claims this process is working on: (tenant, thread_id, key, fencing token) -> how many
# callers here registered it (a claim is registered BEFORE the statement that takes it, so a
# thread of this process reading the row right after the commit never sees it "abandoned";
# the callers that lose the race unregister their count)
_running: dict[tuple[str, str, str, int], int] = {}
_running_lock = threading.Lock()


def register_running(ident: tuple[str, str, str, int]) -> None:
    with _running_lock:
        _running[ident] = _running.get(ident, 0) + 1


def unregister_running(ident: tuple[str, str, str, int]) -> None:
    with _running_lock:
        left = _running.get(ident, 0) - 1
        if left > 0:
            _running[ident] = left
        else:
            _running.pop(ident, None)


def is_running_here(ident: tuple[str, str, str, int]) -> bool:
    with _running_lock:
        return ident in _running


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def local_liveness(me: Holder, ident: tuple[str, str, str, int], host_id: Any, pid: Any,
                   start: Any, nonce: Any) -> Liveness:
    """What this host can tell about a claim's holder from its recorded columns."""
    if me.host_id is None or not isinstance(host_id, str) or host_id != me.host_id:
        return "unknown"  # another host, an old row, or no way to check pids here
    pid_i, start_i = _as_int(pid), _as_int(start)
    if pid_i is None or start_i is None or not 0 < pid_i < _PID_MAX:
        return "unknown"  # missing or malformed holder columns: the lease decides
    if pid_i == me.pid:
        if start_i == me.start and nonce == me.nonce:
            return "alive" if is_running_here(ident) else "dead"
        if start_i == me.start:
            return "unknown"  # same process, another random id: a forged row
        return "dead"  # an earlier process that had our pid
    fields = _stat_fields(pid_i)
    if fields is None:
        return "dead"  # no such process on this host (same boot, same pid namespace)
    if fields[0] in ("Z", "X", "x"):
        return "dead"  # exited, not yet reaped
    try:
        actual = int(fields[19])
    except ValueError:
        return "unknown"
    return "alive" if actual == start_i else "dead"  # another start time: the pid was reused


# --------------------------------------------------------------------------------------------
# PostgreSQL: a session advisory lock per store, held for as long as the process lives
# --------------------------------------------------------------------------------------------
_orphans: list[Any] = []  # connections inherited over fork: never closed by the child
_RECHECK = 1.0  # seconds a checked liveness connection is trusted without a round trip

_monotonic = time.monotonic


class PgSessionLock:
    """One dedicated connection (outside the pool) holding ``pg_advisory_lock(key)``.

    Claims record ``key``; when the process dies, its connection drops and the server releases
    the lock, which any other worker can then observe with ``pg_try_advisory_lock``. The key is
    random (62 bits); a collision can only make a dead holder look alive (the lease decides).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._conn: Any = None
        self._key: int | None = None
        self._pid = os.getpid()
        self._closed = False
        self._checked_at = 0.0

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.close()
        except Exception:  # a broken connection is what we are dropping
            logger.debug("closing the liveness connection failed", exc_info=True)

    def _open(self) -> int:
        raw = self.engine.raw_connection()
        raw.detach()  # ours for the life of the process; not returned to the pool
        dbapi = raw.dbapi_connection
        try:
            for _ in range(8):
                key = self._key or secrets.randbelow((1 << 62) - 1) + 1
                cur = dbapi.cursor()
                try:
                    cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                    row = cur.fetchone()
                finally:
                    cur.close()
                dbapi.commit()
                if row is not None and row[0]:
                    self._conn, self._key = dbapi, key
                    self._checked_at = _monotonic()
                    return key
                # another session holds this key (a checker probing it right now, or a
                # collision): keep our key if it is ours, otherwise draw another one
                if self._key is None:
                    continue
                time.sleep(0.05)
            raise RuntimeError("could not take a session advisory lock")
        except BaseException:
            try:
                dbapi.close()
            except Exception:
                logger.debug("closing a failed liveness connection failed", exc_info=True)
            raise

    def key(self) -> int | None:
        """The key to record on a claim (opening the connection on first use), or None if the
        lock cannot be held (the claim then relies on its lease)."""
        with self._lock:
            if self._closed:
                return None
            if os.getpid() != self._pid:  # forked: the connection belongs to the parent
                if self._conn is not None:
                    _orphans.append(self._conn)
                self._conn, self._key, self._pid = None, None, os.getpid()
            if self._conn is not None:
                if _monotonic() - self._checked_at < _RECHECK:
                    return self._key
                if self._alive():  # idle for a while: the server may have dropped it
                    return self._key
                logger.warning("the liveness connection of the idempotency store was "
                               "dropped; reconnecting")
                self._drop()
            try:
                return self._open()
            except Exception as exc:  # noqa: BLE001 - fall back to the lease, loudly
                logger.warning("no session lock for idempotency claims (%s: %s); claims rely "
                               "on their lease", type(exc).__name__, exc)
                return None

    def ping(self) -> None:
        """Check the connection (heartbeat); reconnect with the same key if it broke."""
        with self._lock:
            if self._conn is None or self._closed or os.getpid() != self._pid:
                return
            if self._alive():
                return
            logger.warning("the liveness connection of the idempotency store broke; "
                           "reconnecting")
            self._drop()
            try:
                self._open()
            except Exception as exc:  # noqa: BLE001 - logged; the lease still protects
                logger.warning("could not re-take the session lock (%s); claims in flight "
                               "rely on their lease", exc)

    def _alive(self) -> bool:
        """One round trip on the dedicated connection (the caller holds ``_lock``)."""
        try:
            cur = self._conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
            self._conn.commit()
        except Exception:  # noqa: BLE001 - any failure means: reconnect
            return False
        self._checked_at = _monotonic()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if os.getpid() == self._pid:
                self._drop()
            self._conn = None

    def holder_gone(self, conn: Any, key: int) -> bool:
        """True if no session holds ``key`` (probed on ``conn``, a pool connection)."""
        import sqlalchemy as sa
        got = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}
                                ).scalar())
        if got:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        return got
