"""The in-memory runtime's record file (``langgraph dev``) sealed at rest.

``langgraph dev`` runs LangGraph Server on its in-memory runtime (``langgraph-runtime-inmem``),
which pickles its records -- threads, runs, assistants, crons -- into
``.langgraph_api/.langgraph_ops.pckl`` every ten seconds and when the server stops. The
``encryption`` entry of langgraph.json seals most fields of those records, but two copies are
written in clear without any handler being called: each thread's ``values``/``interrupts``
(the latest state) and the ``kwargs`` (input, config) of every run the worker started. The
runtime offers no hook for its file, so :func:`seal_server_records` wraps the two places that
touch it:

* writing: the record store's ``dump`` -- the runtime's own pickle of the records, sealed with
  AES-256-GCM before it reaches the disk (the runtime still writes a temporary file and moves
  it into place);
* reading: ``start_pool`` -- before the runtime looks at the file, it is read, authenticated
  and only then unpickled. A file that does not authenticate (altered, truncated, written for
  another database or under another name) or that is not sealed at all (a plain pickle:
  written without sealing, or replaced) raises :class:`TamperedDataError`: the server does not
  start and the file stays as it is. (The runtime on its own deletes a file it cannot load and
  starts empty; here that never happens to a sealed file.) No file: the server starts empty.

The key: HKDF-SHA256 of the database's installation key (the registry MAC key of
``SECURESAVER_URL``: random, wrapped by the keyring like a tenant's keys, rewrapped by master
key rotation), with its own label, so it is never the key of anything else. The associated
data binds the database id and the file's name as the runtime names it. One key for the whole
file: the file holds every tenant's records, so a tenant shred does not reach the copies in it
(the server deletes a thread's copy with the thread).

Call it from the module the server imports *before* it reads its records -- the auth module
(``"auth"`` in langgraph.json; the checkpointer, store and encryption modules are imported
after the runtime has loaded the file)::

    from langgraph_securesaver.server.records import seal_server_records
    seal_server_records()

``SECURESAVER_SERVER_RECORDS=off`` turns it off. It changes nothing when the in-memory runtime
is not loaded (``langgraph up``, the platform) and only warns when the runtime's version is not
one it was written for (:data:`KNOWN_RUNTIME_VERSIONS`) or when it is called after the runtime
loaded its records; in those cases, and when it is off, a sealed file on disk raises
:class:`ConfigurationError` instead (the runtime would discard it).

``python -m langgraph_securesaver.server.records seal|unseal FILE`` converts a file (the
``SECURESAVER_*`` environment names the keys).
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import os
import pickle
import secrets
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import ConfigurationError, TamperedDataError
from ..keys.tokens import associated_data
from ..registry.core import Registry
from ..storage.backends import registry_url_for
from .settings import ServerSettings

logger = logging.getLogger(__name__)

#: versions of ``langgraph-runtime-inmem`` whose record file this module was written for
KNOWN_RUNTIME_VERSIONS: frozenset[str] = frozenset({"0.36.7"})
#: the record file, as the runtime names it (relative to the server's working directory)
OPS_FILENAME = os.path.join(".langgraph_api", ".langgraph_ops.pckl")
ENV_VAR = "SECURESAVER_SERVER_RECORDS"
#: the first bytes of a sealed file (a pickle starts with 0x80 or an opcode letter)
MAGIC = b"SSREC\x01"
_NONCE = 12
_TAG = 16
_KEY_INFO = b"securesaver/langgraph-server-records/v1"

SEALED, OFF, NO_RUNTIME, UNSUPPORTED, TOO_LATE = (
    "sealed", "off", "no-runtime", "unsupported", "too-late")


class RecordsSealer:
    """Seals and opens the record file with the database's records key.

    Args:
        settings: the keyring and database (default: ``SECURESAVER_*`` on first use).
        name: the file's name as the runtime names it (bound into every seal).
    """

    def __init__(self, settings: ServerSettings | None = None, name: str = OPS_FILENAME
                 ) -> None:
        self._settings = settings
        self.name = Path(name).as_posix()
        self._lock = threading.Lock()
        self._registry: Registry | None = None
        self._aes: AESGCM | None = None
        self._aad = b""

    def __repr__(self) -> str:
        return f"RecordsSealer(name={self.name!r})"

    def ready(self) -> None:
        """Load the key now (a missing or wrong keyring is reported at start-up)."""
        self._cipher()

    def _cipher(self) -> AESGCM:
        with self._lock:
            if self._aes is None:
                cfg = self._settings or ServerSettings.from_env()
                registry = Registry(registry_url_for(cfg.url))
                try:
                    registry.attach_keys(cfg.keyring)
                    registry.setup()
                    database_id = registry.database_id()
                    aes = AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                                      info=_KEY_INFO).derive(registry.integrity.key().reveal()))
                except BaseException:
                    registry.dispose()
                    raise
                self._registry = registry
                self._aad = associated_data("langgraph-server-records", MAGIC.hex(),
                                            database_id, self.name)
                self._aes = aes
            return self._aes

    def close(self) -> None:
        with self._lock:
            if self._registry is not None:
                self._registry.dispose()
            self._registry, self._aes = None, None

    def seal(self, plaintext: bytes) -> bytes:
        aes = self._cipher()
        nonce = secrets.token_bytes(_NONCE)
        return MAGIC + nonce + aes.encrypt(nonce, plaintext, self._aad)

    def open(self, data: bytes) -> bytes:
        """The plaintext of a sealed file; :class:`TamperedDataError` for anything else."""
        if not is_sealed(data):
            raise TamperedDataError(
                f"LangGraph Server's record file {self.name} is not sealed (a plain pickle, or "
                "not a record file): it was written without sealing, or replaced; refusing to "
                "load it. A file from before sealing was turned on: seal it with `python -m "
                "langgraph_securesaver.server.records seal FILE`, or move it away to start "
                "empty")
        if len(data) < len(MAGIC) + _NONCE + _TAG:
            raise TamperedDataError(f"LangGraph Server's record file {self.name} is truncated")
        aes = self._cipher()
        nonce = data[len(MAGIC):len(MAGIC) + _NONCE]
        try:
            return aes.decrypt(nonce, data[len(MAGIC) + _NONCE:], self._aad)
        except InvalidTag:
            raise TamperedDataError(
                f"LangGraph Server's record file {self.name} failed authentication: it was "
                "altered, or sealed for another database or file; refusing to load it"
            ) from None

    def read(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """The records in a sealed file: authenticated first, unpickled after."""
        plaintext = self.open(Path(path).read_bytes())
        try:
            records = pickle.loads(plaintext)  # noqa: S301  # authenticated just above
        except Exception as exc:  # authentic, but this code cannot load it
            raise ConfigurationError(
                f"LangGraph Server's record file {self.name} is authentic but cannot be "
                f"unpickled by this code ({type(exc).__name__}: the graph's classes changed?); "
                "move it away to start empty") from exc
        if not isinstance(records, dict):
            raise TamperedDataError(f"LangGraph Server's record file {self.name} does not "
                                    "hold the runtime's records")
        return records


def is_sealed(data: bytes) -> bool:
    return data[:len(MAGIC)] == MAGIC


def _file_is_sealed(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return is_sealed(fh.read(len(MAGIC)))
    except FileNotFoundError:
        return False


def _refuse_if_sealed(path: str, why: str) -> None:
    if _file_is_sealed(path):
        raise ConfigurationError(
            f"{path} is sealed by langgraph-securesaver but {why}: the runtime cannot read "
            "it and would discard it. Turn sealing on (a supported runtime, "
            f"{ENV_VAR}=on, seal_server_records() in the auth module), or convert it with "
            "`python -m langgraph_securesaver.server.records unseal FILE`")


# --------------------------------------------------------------------------------------------
# the runtime wrapper
# --------------------------------------------------------------------------------------------
_STATE: dict[str, Any] = {"sealer": None}
_VERIFIED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "securesaver_verified_records", default=None)


def installed() -> RecordsSealer | None:
    """The sealer this process installed into the runtime (None: the file is not sealed)."""
    sealer = _STATE["sealer"]
    return sealer if isinstance(sealer, RecordsSealer) else None


def seal_server_records(settings: ServerSettings | None = None) -> str:
    """Seal the in-memory runtime's record file at rest (see the module docstring).

    Returns what it did: ``"sealed"`` (installed, or already), ``"off"``
    (``SECURESAVER_SERVER_RECORDS=off``), ``"no-runtime"`` (the in-memory runtime is not
    loaded in this process), ``"unsupported"`` (a runtime version it does not know) or
    ``"too-late"`` (the runtime already loaded its records).
    """
    database = sys.modules.get("langgraph_runtime_inmem.database")
    if database is None:
        logger.debug("the in-memory runtime is not loaded: nothing to seal")
        return NO_RUNTIME
    path = getattr(database, "OPS_FILENAME", OPS_FILENAME)
    if installed() is not None:
        return SEALED
    setting = os.environ.get(ENV_VAR, "on").strip().lower()
    if setting not in ("on", "off", "true", "false", "1", "0"):
        raise ConfigurationError(f"{ENV_VAR} must be on or off, got {setting!r}")
    if setting in ("off", "false", "0"):
        _refuse_if_sealed(path, f"{ENV_VAR} is off")
        logger.warning("%s=off: LangGraph Server's record file %s is written in clear",
                       ENV_VAR, path)
        return OFF
    package = sys.modules.get("langgraph_runtime_inmem")
    version = str(getattr(package, "__version__", "unknown"))
    problem = _unsupported(database, version)
    if problem is not None:
        _refuse_if_sealed(path, f"the runtime is not one this version knows ({problem})")
        logger.warning("langgraph-runtime-inmem %s is not a version SecureSaver knows (%s): "
                       "its record file %s is left alone and is written in clear (known: %s)",
                       version, problem, path, ", ".join(sorted(KNOWN_RUNTIME_VERSIONS)))
        return UNSUPPORTED
    persistence = sys.modules.get("langgraph_runtime_inmem._persistence")
    if path in (getattr(persistence, "_stores", None) or {}):
        logger.warning("seal_server_records() was called after the in-memory runtime loaded "
                       "its records: %s is left alone and is written in clear. Call it from "
                       "the auth module (loaded before the records)", path)
        return TOO_LATE
    _install(database, RecordsSealer(settings, path))
    logger.info("LangGraph Server's record file %s is sealed at rest", path)
    return SEALED


def _unsupported(database: Any, version: str) -> str | None:
    if version not in KNOWN_RUNTIME_VERSIONS:
        return f"version {version}"
    store = getattr(database, "GLOBAL_STORE", None)
    lifespan = sys.modules.get("langgraph_runtime_inmem.lifespan")
    for ok, what in (
            (store is not None and getattr(store, "filename", None) == database.OPS_FILENAME,
             "GLOBAL_STORE"),
            (callable(getattr(type(store), "dump", None))
             and callable(getattr(type(store), "load", None)), "dump/load"),
            (callable(getattr(database, "start_pool", None)), "start_pool"),
            (lifespan is None or getattr(lifespan, "start_pool", None) is database.start_pool,
             "lifespan.start_pool")):
        if not ok:
            return f"no {what} as expected"
    return None


def _install(database: Any, sealer: RecordsSealer) -> None:
    store = database.GLOBAL_STORE
    base = type(store)

    class SealedRecords(base):  # type: ignore[valid-type,misc]
        """The runtime's record store, sealed when written, authenticated when read."""

        def dump(self, fileobj: Any) -> None:
            buffer = io.BytesIO()
            base.dump(self, buffer)       # the runtime's own pickle of its records
            fileobj.write(sealer.seal(buffer.getvalue()))

        def load(self) -> None:
            records = _VERIFIED.get()     # read and authenticated before start_pool ran
            if records is None:
                records = sealer.read(self.filename)
            self.update(records)

    SealedRecords.__name__ = SealedRecords.__qualname__ = f"Sealed{base.__name__}"
    store.__class__ = SealedRecords
    original: Callable[..., Any] = database.start_pool

    async def start_pool(*args: Any, **kwargs: Any) -> Any:
        path = database.OPS_FILENAME
        if os.path.exists(path):
            # refused here, before the runtime's loader (which deletes what it cannot load)
            token = _VERIFIED.set(await asyncio.to_thread(sealer.read, path))
        else:
            await asyncio.to_thread(sealer.ready)
            token = _VERIFIED.set(None)
        try:
            return await original(*args, **kwargs)
        finally:
            _VERIFIED.reset(token)

    database.start_pool = start_pool
    lifespan = sys.modules.get("langgraph_runtime_inmem.lifespan")
    if lifespan is not None:
        setattr(lifespan, "start_pool", start_pool)  # noqa: B010  # the name it imported
    _STATE["sealer"] = sealer


def warn_if_unsealed() -> None:
    """Called when the server opens SecureSaver's checkpointer: a warning when the in-memory
    runtime writes its record file in clear although sealing was not turned off."""
    if sys.modules.get("langgraph_runtime_inmem.database") is None or installed() is not None:
        return
    if os.environ.get(ENV_VAR, "on").strip().lower() in ("off", "false", "0"):
        return
    logger.warning(
        "LangGraph Server's record file %s holds thread state and run input in clear: call "
        "langgraph_securesaver.server.records.seal_server_records() from the auth module "
        "(docs/guides/langgraph-server.md)", OPS_FILENAME)


# --------------------------------------------------------------------------------------------
# converting a file
# --------------------------------------------------------------------------------------------
def seal_file(path: str | os.PathLike[str], sealer: RecordsSealer) -> None:
    """Seal a plain record file in place (its bytes are sealed as they are: not unpickled)."""
    target = Path(path)
    data = target.read_bytes()
    if is_sealed(data):
        raise ConfigurationError(f"{target} is already sealed")
    _replace(target, sealer.seal(data))


def unseal_file(path: str | os.PathLike[str], sealer: RecordsSealer) -> None:
    """Replace a sealed record file by its plain pickle (after it authenticated)."""
    target = Path(path)
    _replace(target, sealer.open(target.read_bytes()))


def _replace(target: Path, data: bytes) -> None:
    temp = target.with_name(target.name + ".tmp")
    temp.write_bytes(data)
    os.replace(temp, target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("seal", "unseal"):
        print("usage: python -m langgraph_securesaver.server.records seal|unseal FILE",
              file=sys.stderr)
        return 2
    sealer = RecordsSealer()
    try:
        (seal_file if args[0] == "seal" else unseal_file)(args[1], sealer)
    except (TamperedDataError, ConfigurationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        sealer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
