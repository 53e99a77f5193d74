"""Key rotation: a new master version (rewrap, fast) and, optionally, re-encryption of the data.

Two levels, as in the key hierarchy:

* **Master rotation** (:func:`rotate_keys`): add a master version to the keyring file, rewrap
  every tenant's data keys under it (no data rewrite), and optionally retire the old versions
  once :meth:`SecureSaver.master_versions_in_use` shows they wrap nothing.
* **Re-encryption** (:func:`reencrypt`, or ``rotate_keys(reencrypt=True)``): give each tenant a
  new data-key version and rewrite every stored ciphertext under it: channel values (SQLite
  checkpoint documents, Postgres ``checkpoint_blobs``), pending writes, sealed metadata and the
  PII vault (plus any sealed column a companion registered, see
  :func:`~langgraph_securesaver.storage.sealed_columns.register_sealed_column`).

Re-encryption runs **online**: rows are read a page at a time and each is rewritten with a
compare-and-swap (``UPDATE ... WHERE`` the row still holds the ciphertext that was read), so a
graph writing the same row meanwhile wins and the row is revisited on the next pass. Each page
is one transaction. It is **resumable**: rows already under the tenant's newest data key are
skipped, and an interrupted ``rotate_keys(reencrypt=True)`` (even SIGKILL) is recognised from
its ``key_rotation_started`` event and continued without adding another master version or
rotating the data keys again. Passes repeat until one finds nothing left to rewrite.

Processes that keep a tenant's keys cached keep sealing new data with the old data-key
version until they reload them (restart, or ``saver.keys.forget()``); the final passes pick up
what they wrote meanwhile, and a later ``reencrypt`` finishes the rest.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, SecureSaverError, TamperedDataError
from ..keys.crypto import THREAD_KEY_VERSION, TenantKeys, is_token
from ..keys.tokens import from_text, to_text, token_key_version
from ..seal import SEALED_METADATA_KEY
from ..storage.raw_tables import (
    BlobRow,
    CheckpointRow,
    RawTables,
    TenantIndex,
    WriteRow,
    raw_tables_for,
)
from ..storage.registry_tables import (
    WRAPPED_KEY_COLUMNS,
    RegistryChange,
    RegistryTable,
    cas_update_registry,
    count_rows,
    registry_rows,
    registry_tables,
)
from ..storage.sealed_columns import SEALED_COLUMNS
from ..tenancy import ThreadRef

if TYPE_CHECKING:
    from ..services import SaverLike

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 200
MAX_PASSES = 4
JOB_STARTED = "key_rotation_started"
JOB_FINISHED = "key_rotation_finished"


@dataclass
class ReencryptReport:
    targets: dict[str, int] = field(default_factory=dict)      # tenant -> newest data key
    rewritten: dict[str, int] = field(default_factory=dict)    # table -> rows rewritten
    tokens: int = 0                 # ciphertexts re-sealed
    already_current: int = 0        # rows skipped: already under the newest data key
    conflicts: int = 0              # lost a compare-and-swap to a concurrent write (revisited)
    errors: list[str] = field(default_factory=list)   # rows that could not be opened (no values)
    passes: int = 0
    remaining: int = 0              # rows still under an older data key after the last pass
    not_covered: dict[str, int] = field(default_factory=dict)  # sealed columns without a place
    stopped: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.errors or self.remaining or self.stopped)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "targets": self.targets, "rewritten": self.rewritten,
                "tokens": self.tokens, "already_current": self.already_current,
                "conflicts": self.conflicts, "errors": self.errors, "passes": self.passes,
                "remaining": self.remaining, "not_covered": self.not_covered,
                "stopped": self.stopped, "duration_s": round(self.duration, 3)}


@dataclass
class RotationReport:
    job: str
    master_version: str
    resumed: bool
    rewrapped: int = 0
    rotated_tenants: list[str] = field(default_factory=list)
    reencrypt: ReencryptReport | None = None
    master_versions_in_use: dict[str, int] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "job": self.job, "master_version": self.master_version,
                "resumed": self.resumed, "rewrapped_key_rows": self.rewrapped,
                "rotated_tenants": self.rotated_tenants,
                "reencrypt": None if self.reencrypt is None else self.reencrypt.as_dict(),
                "master_versions_in_use": self.master_versions_in_use,
                "retired": self.retired, "problems": self.problems}


class _Pass:
    """One pass over every sealed place; rewrites what is not under the newest data key."""

    def __init__(self, job: Reencryption) -> None:
        self.job = job
        self.report = job.report
        self.raw = job.raw
        self.codec = job.saver.codec
        self.found = 0        # stale rows met in this pass (rewritten or conflicted)
        self.conflicts = 0
        self.first = job.report.passes == 1

    def _current(self) -> None:
        if self.first:
            self.report.already_current += 1

    def _stale(self, keys: TenantKeys, token: Any) -> bool:
        # a token under its thread's own key is current whatever the tenant's data key
        return is_token(token) and token_key_version(token) not in (keys.current_version,
                                                                     THREAD_KEY_VERSION)

    def _reseal(self, keys: TenantKeys, token: bytes, aad: bytes) -> bytes:
        self.report.tokens += 1
        return keys.seal(keys.open(token, aad), aad)

    def _done(self, table: str, applied: Iterable[bool]) -> None:
        for ok in applied:
            if ok:
                self.report.rewritten[table] = self.report.rewritten.get(table, 0) + 1
            else:
                self.conflicts += 1
                self.report.conflicts += 1

    # inner tables ---------------------------------------------------------------------------
    def checkpoints(self, rows: list[CheckpointRow]) -> int:
        planned: list[tuple[CheckpointRow, dict[str, bytes], str | None]] = []
        for row in rows:
            place = self.job.place(row.thread_id, row.checkpoint_ns)
            if place is None:
                continue
            keys, ref = place
            if (row.checkpoint is None or row.metadata is None or row.foreign is not None
                    or not isinstance(row.metadata.get(SEALED_METADATA_KEY), str)
                    or not all(is_token(v) for v in row.channel_values.values())):
                self.job.error("checkpoints", ref, f"checkpoint {row.checkpoint_id} (undecodable "
                               "or holding a payload SecureSaver never writes)")
                continue
            try:
                values: dict[str, bytes] = {}
                versions = row.channel_versions
                for channel, token in row.channel_values.items():
                    if self._stale(keys, token):
                        aad = self.codec.channel_aad(ref, channel, versions.get(channel))
                        values[channel] = self._reseal(keys, token, aad)
                sealed_md = None
                text = row.metadata.get(SEALED_METADATA_KEY)
                if isinstance(text, str):
                    token = from_text(text)
                    if self._stale(keys, token):
                        sealed_md = to_text(self._reseal(
                            keys, token, self.codec.metadata_aad(ref, row.checkpoint_id)))
            except TamperedDataError:
                self.job.error("checkpoints", ref, f"checkpoint {row.checkpoint_id}")
                continue
            if values or sealed_md is not None:
                planned.append((row, values, sealed_md))
            else:
                self._current()
        if planned:
            self.found += len(planned)
            with self.raw.transaction():
                applied = [self.raw.update_checkpoint(
                    row, channel_values=values or None,
                    metadata_key=SEALED_METADATA_KEY if md is not None else None,
                    metadata_value=md) for row, values, md in planned]
            self._done("checkpoints", applied)
        return len(planned)

    def blobs(self, rows: list[BlobRow]) -> int:
        planned: list[tuple[BlobRow, bytes]] = []
        for row in rows:
            place = self.job.place(row.thread_id, row.checkpoint_ns)
            if place is None or row.blob is None:
                continue
            keys, ref = place
            if row.type != "bytes" or not is_token(row.blob):
                self.job.error("checkpoint_blobs", ref, f"channel {row.channel} (not sealed)")
                continue
            if not self._stale(keys, row.blob):
                self._current()
                continue
            try:
                aad = self.codec.channel_aad(ref, row.channel, row.version)
                planned.append((row, self._reseal(keys, row.blob, aad)))
            except TamperedDataError:
                self.job.error("checkpoint_blobs", ref, f"channel {row.channel}")
        if planned:
            self.found += len(planned)
            with self.raw.transaction():
                applied = [self.raw.update_blob(row, blob) for row, blob in planned]
            self._done("checkpoint_blobs", applied)
        return len(planned)

    def writes(self, rows: list[WriteRow]) -> int:
        table = "checkpoint_writes" if self.raw.backend == "postgres" else "writes"
        planned: list[tuple[WriteRow, bytes]] = []
        for row in rows:
            place = self.job.place(row.thread_id, row.checkpoint_ns)
            if place is None or row.value is None:
                continue
            keys, ref = place
            if row.type != "bytes" or not is_token(row.value):
                self.job.error(table, ref, f"write {row.checkpoint_id}/{row.task_id}/{row.idx} "
                               "(not sealed)")
                continue
            if not self._stale(keys, row.value):
                self._current()
                continue
            try:
                aad = self.codec.write_aad(ref, row.checkpoint_id, row.task_id, row.channel)
                planned.append((row, self._reseal(keys, row.value, aad)))
            except TamperedDataError:
                self.job.error(table, ref, f"write {row.checkpoint_id}/{row.task_id}/{row.idx}")
        if planned:
            self.found += len(planned)
            with self.raw.transaction():
                applied = [self.raw.update_write(row, value) for row, value in planned]
            self._done(table, applied)
        return len(planned)

    # registry tables ------------------------------------------------------------------------
    def registry(self, table: RegistryTable, rows: list[dict[str, Any]]) -> int:
        changes: list[RegistryChange] = []
        for row in rows:
            for column in table.binary_columns:
                value = row.get(column)
                if value is None or (table.name, column) in WRAPPED_KEY_COLUMNS:
                    continue
                value = bytes(value)
                spec = SEALED_COLUMNS.get((table.name, column))
                tenant = row.get(spec.tenant_column if spec else "tenant")
                if not isinstance(tenant, str) or not is_token(value):
                    continue
                if self.job.scope is not None and tenant not in self.job.scope:
                    continue
                keys = self.job.keys(tenant)
                if keys is None:
                    continue
                if not self._stale(keys, value):
                    self._current()
                    continue
                if spec is None:  # a sealed column whose associated data is not known here
                    name = f"{table.name}.{column}"
                    if self.report.passes == 1:
                        self.report.not_covered[name] = self.report.not_covered.get(name, 0) + 1
                    continue
                try:
                    new = self._reseal(keys, value, spec.aad(row))
                except TamperedDataError:
                    self.job.error(table.name, None, f"{column} of a {tenant!r} row")
                    continue
                changes.append(RegistryChange(
                    {k: row[k] for k in table.key_columns}, column, value, new))
        if changes:
            self.found += len(changes)
            self._done(table.name, cas_update_registry(self.job.saver.registry.engine,
                                                       table.table, changes))
        return len(changes)


class Reencryption:
    """Re-encrypt every stored ciphertext under each tenant's newest data key. See
    :func:`reencrypt`."""

    def __init__(self, saver: SaverLike, *, tenants: Iterable[str] | None = None,
                 batch_size: int = DEFAULT_BATCH, max_rate: float | None = None,
                 max_passes: int = MAX_PASSES,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        if batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        if max_rate is not None and max_rate <= 0:
            raise ConfigurationError("max_rate must be positive (rows per second)")
        self.saver = saver
        self.scope = None if tenants is None else set(tenants)
        self.batch = batch_size
        self.max_rate = max_rate
        self.max_passes = max(1, max_passes)
        self.progress = progress
        self.should_stop = should_stop or (lambda: False)
        self.raw: RawTables = raw_tables_for(saver.inner)
        self.report = ReencryptReport()
        self.index = TenantIndex([])
        self._keys: dict[str, TenantKeys | None] = {}
        self._errors: set[str] = set()
        self._rate_started = 0.0
        self._rate_rows = 0
        self._done = 0
        self._total = 0

    def keys(self, tenant: str) -> TenantKeys | None:
        if tenant not in self._keys:
            try:
                keys = self.saver.keys.keys_for(tenant, create=False)
            except SecureSaverError as exc:
                self._error(f"tenant {tenant!r}: data keys do not unwrap ({type(exc).__name__})")
                keys = None
            self._keys[tenant] = keys
            if keys is not None:
                self.report.targets[tenant] = keys.current_version
        return self._keys[tenant]

    def place(self, inner_id: str, ns: str) -> tuple[TenantKeys, ThreadRef] | None:
        tenant, thread = self.index.split(inner_id)
        if tenant is None or (self.scope is not None and tenant not in self.scope):
            return None
        keys = self.keys(tenant)
        return None if keys is None else (keys, ThreadRef(tenant, thread, ns))

    def error(self, table: str, ref: ThreadRef | None, what: str) -> None:
        where = "" if ref is None else f" of tenant {ref.tenant!r} thread {ref.thread_id!r}"
        self._error(f"{table}: {what}{where} does not authenticate; left as is")

    def _error(self, message: str) -> None:
        """Each problem once, however many passes meet it (and at most 1000 of them)."""
        if message not in self._errors and len(self._errors) < 1000:
            self._errors.add(message)
            self.report.errors.append(message)
            logger.warning("re-encryption: %s", message)

    def _throttle(self, rewritten: int) -> None:
        self._rate_rows += rewritten
        if self.max_rate is None or not rewritten:
            return
        due = self._rate_started + self._rate_rows / self.max_rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _tick(self, n: int) -> None:
        self._done += n
        if self.progress:
            self.progress(self._done, self._total)

    def _run_pass(self, tables: list[RegistryTable]) -> _Pass:
        self.saver.keys.forget()       # pick up the newest data-key version of every tenant
        self._keys.clear()
        self.index = TenantIndex(self.saver.registry.tenants())
        one = _Pass(self)
        sources: list[tuple[Any, Callable[[Any], int]]] = [
            (self.raw.checkpoints(self.batch), one.checkpoints),
            (self.raw.blobs(self.batch), one.blobs),
            (self.raw.writes(self.batch), one.writes),
        ]
        for table in tables:
            sources.append((registry_rows(self.saver.registry.engine, table, self.batch),
                            partial(one.registry, table)))
        for pages, handle in sources:
            for rows in pages:
                if self.should_stop():
                    self.report.stopped = True
                    return one
                self._throttle(handle(rows))
                self._tick(len(rows))
        return one

    def run(self) -> ReencryptReport:
        started = time.monotonic()
        self._rate_started = started
        engine = self.saver.registry.engine
        tables = [t for t in registry_tables(engine)
                  if any((t.name, c) not in WRAPPED_KEY_COLUMNS for c in t.binary_columns)]
        per_pass = sum(self.raw.counts().values()) + sum(count_rows(engine, t) for t in tables)
        for number in range(1, self.max_passes + 1):
            self.report.passes = number
            self._total += per_pass
            one = self._run_pass(tables)
            if self.report.stopped:
                break
            if one.found == 0:
                self.report.remaining = 0
                break
            self.report.remaining = one.conflicts
            if number == self.max_passes:
                # the last pass rewrote what it met; only its lost races are known to remain
                logger.warning("re-encryption stopped after %d passes with %d rows contended",
                               number, one.conflicts)
        self.report.duration = time.monotonic() - started
        return self.report


def reencrypt(saver: SaverLike, *, tenants: Iterable[str] | None = None,
              batch_size: int = DEFAULT_BATCH, max_rate: float | None = None,
              max_passes: int = MAX_PASSES, progress: Callable[[int, int], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> ReencryptReport:
    """Rewrite every ciphertext not under its tenant's newest data-key version (online,
    resumable; see the module docstring). Rotate the data keys first
    (:meth:`SecureSaver.rotate_data_key`) to move data off the current ones.

    ``batch_size`` rows are read and rewritten per transaction; ``max_rate`` caps rewritten rows
    per second (load on a live database); ``should_stop()`` is polled between batches.
    """
    return Reencryption(saver, tenants=saver.services.gate.reencrypt_tenants(tenants),
                        batch_size=batch_size, max_rate=max_rate, max_passes=max_passes,
                        progress=progress, should_stop=should_stop).run()


@dataclass(frozen=True)
class RotationJob:
    job: str
    master_version: str
    started_at: float
    reencrypt: bool


def unfinished_job(saver: SaverLike) -> RotationJob | None:
    """The latest ``rotate_keys(reencrypt=True)`` that started and never finished, if any."""
    registry = saver.registry
    finished = {str(e.detail.get("job")) for e in registry.list_events(kind=JOB_FINISHED)}
    for event in reversed(registry.list_events(kind=JOB_STARTED)):
        job = str(event.detail.get("job"))
        if job in finished:
            return None
        if event.detail.get("reencrypt"):
            return RotationJob(job, str(event.detail.get("master_version")), event.at, True)
        return None
    return None


def _file_keyring(saver: SaverLike) -> Any:
    ring: Any = saver.keyring
    if not all(hasattr(ring, name) for name in ("add_version", "persist", "retire_version")):
        raise ConfigurationError(
            f"{type(ring).__name__} cannot add master versions here; rotate at your key "
            "provider, then call saver.rewrap_keys()")
    if getattr(ring, "path", None) is None and not getattr(ring, "persists_itself", False):
        raise ConfigurationError(
            "rotation rewrites the keyring: load it with Keyring.from_file(path) (an environment "
            "keyring cannot be changed from here; add a version to the variable and run "
            "saver.rewrap_keys())")
    return ring


def retire_unused_masters(saver: SaverLike) -> tuple[list[str], list[str]]:
    """Forget every non-current master version that wraps no key row; persist the keyring.
    Returns (retired, still in use)."""
    ring = _file_keyring(saver)
    current = ring.current_version
    in_use = saver.master_versions_in_use()
    old = [v for v in ring.versions() if v != current and not ring.shredded_from(v)]
    busy = [v for v in old if in_use.get(v)]
    if busy:
        return [], busy
    if old:   # another database's key rows may still be wrapped under them
        saver.require_sole_database("retiring master versions")
    for version in old:
        ring.retire_version(version)
    if old:
        ring.persist()
        saver.registry.record_event("master_keys_retired", versions=old, current=current)
        logger.info("retired master versions %s", old)
    return old, []


def rotate_keys(saver: SaverLike, *, reencrypt: bool = False, retire_old: bool = False,
                batch_size: int = DEFAULT_BATCH, max_rate: float | None = None,
                progress: Callable[[str, int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> RotationReport:
    """Add a master version to the keyring file and rewrap every data key under it; with
    ``reencrypt``, also rotate each tenant's data key and re-encrypt the stored data; with
    ``retire_old``, then forget the master versions nothing uses any more.

    An interrupted ``reencrypt=True`` run is resumed by calling this again: no new master
    version, no second data-key rotation, rows already re-encrypted are skipped.
    ``progress(stage, done, total)`` reports "rewrap" and "reencrypt".
    """
    saver.services.gate.admin_tenant("rotate_keys", operator_only=True)
    ring = _file_keyring(saver)
    reload = getattr(ring, "reload", None)
    if callable(reload):   # start from the keyring file as it is now, not as it was loaded
        reload()
    registry = saver.registry
    job = unfinished_job(saver) if reencrypt else None
    resumed = job is not None and job.master_version == ring.current_version
    if job is None or not resumed:
        started = time.time()
        version = ring.add_version()
        ring.persist()
        job = RotationJob(uuid.uuid4().hex, version, started, reencrypt)
        registry.record_event(JOB_STARTED, job=job.job, master_version=version,
                              reencrypt=reencrypt)
        logger.info("master version %s added (job %s)", version, job.job)
    else:
        logger.info("resuming interrupted key rotation %s (master version %s)", job.job,
                    job.master_version)
    report = RotationReport(job.job, job.master_version, resumed)

    def stage(name: str) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        return lambda done, total: progress(name, done, total)

    report.rewrapped = saver.rewrap_keys(progress=stage("rewrap"))
    if reencrypt:
        for tenant in registry.tenants_with_keys():
            data = [r for r in registry.load_key_rows(tenant) if r.purpose == "data"]
            if data and max(r.created_at for r in data) < job.started_at:
                saver.rotate_data_key(tenant)
                report.rotated_tenants.append(tenant)
        report.reencrypt = Reencryption(saver, batch_size=batch_size, max_rate=max_rate,
                                        progress=stage("reencrypt"),
                                        should_stop=should_stop).run()
        re = report.reencrypt
        if re.stopped:
            report.problems.append("stopped before the end: run the same command again to "
                                   "resume")
        if re.errors:
            report.problems.append(f"{len(re.errors)} row(s) do not authenticate and were left "
                                   "as they are (run `securesaver scan --verify`)")
        if re.remaining:
            report.problems.append(f"{re.remaining} row(s) are still under older data keys "
                                   "(concurrent writers with stale keys): run again")
    if report.reencrypt is None or not report.reencrypt.stopped:
        done: dict[str, Any] = {"rewrapped": report.rewrapped,
                                "rotated": len(report.rotated_tenants)}
        if report.reencrypt is not None:
            done["rows_rewritten"] = sum(report.reencrypt.rewritten.values())
            done["remaining"] = report.reencrypt.remaining
        registry.record_event(JOB_FINISHED, job=job.job, master_version=job.master_version,
                              **done)
    if retire_old:
        try:
            retired, busy = retire_unused_masters(saver)
        except ConfigurationError as exc:   # the keyring serves another database
            retired, busy = [], []
            report.problems.append(str(exc))
        report.retired = retired
        if busy:
            report.problems.append(f"master version(s) {', '.join(busy)} still wrap key rows; "
                                   "not retired")
    report.master_versions_in_use = saver.master_versions_in_use()
    return report
