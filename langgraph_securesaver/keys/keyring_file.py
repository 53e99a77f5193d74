"""Keyring files on disk: who may read them, how they are replaced, and the lock beside them.

* **Loading** refuses a file that group or others can read or write, or that another user
  owns: the file is as sensitive as every conversation it protects. Some deployments cannot
  set 0600 on a file they do not own (a Kubernetes secret volume is a read-only mount of
  root-owned 0644 files behind symlinks); they opt out explicitly with
  ``allow_insecure_permissions=True`` or ``SECURESAVER_ALLOW_INSECURE_KEYRING=1``.
* **Saving** writes a temporary 0600 file in the same directory, fsyncs it and renames it
  over the target (atomic). A symlink at the target is refused, never replaced: it usually is
  a mounted secret that a regular file would silently stop following, and writing keys
  through a link someone else placed sends them wherever it points.

The file's text is read and written as :class:`~.material.SecretText`.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigurationError, KeyringRequired
from .material import Refusal, SecretText, refusing_outside

logger = logging.getLogger(__name__)

#: set to 1/true/yes to load keyring files whatever their mode and owner (see module doc)
INSECURE_ENV_VAR = "SECURESAVER_ALLOW_INSECURE_KEYRING"
_MAX_FILE_BYTES = 16 << 20
_TRUE = frozenset({"1", "true", "yes", "on"})


def insecure_allowed(explicit: bool | None) -> bool:
    """``explicit`` if given, else whether :data:`INSECURE_ENV_VAR` is set to a true value."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(INSECURE_ENV_VAR, "").strip().lower() in _TRUE


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def file_stamp(path: Path) -> tuple[int, int, int]:
    """What changes when the file is replaced or edited (a reload compares it)."""
    return _stamp(os.stat(path))


def _where(path: Path) -> str:
    """The path, and the file it resolves to when that differs (a symlinked secret)."""
    try:
        real = Path(os.path.realpath(path))
    except OSError:
        return str(path)
    return str(path) if real == Path(os.path.abspath(path)) else f"{path} (-> {real})"


def check_permissions(path: Path, st: os.stat_result, what: str = "keyring file") -> None:
    """Refuse a keyring file (or another file of key material, ``what``) group or others can
    read or write (whatever the other bits), or another user owns."""
    mode = stat.S_IMODE(st.st_mode)
    hint = (f"; or, if this is a read-only secret mount you cannot chmod (e.g. a Kubernetes "
            f"secret volume), opt out with allow_insecure_permissions=True or "
            f"{INSECURE_ENV_VAR}=1")
    if mode & 0o066:     # any read or write bit of group or others: 0640, 0644, 0660, 0602...
        can = " and ".join(word for word, bits in (("read", 0o044), ("write", 0o022))
                           if mode & bits)
        raise ConfigurationError(
            f"{what} {_where(path)} has mode {mode:04o}: group or others can "
            f"{can} it; run `chmod 600 {path}`{hint}")
    geteuid = getattr(os, "geteuid", None)
    if geteuid is not None and st.st_uid != geteuid():
        raise ConfigurationError(
            f"{what} {_where(path)} (mode {mode:04o}) is owned by uid {st.st_uid}, not "
            f"by this process's user (uid {geteuid()}); `chown` it{hint}")


def read_keyring_text(path: Path, allow_insecure: bool) -> tuple[SecretText, tuple[int, int, int]]:
    """The file's text and stamp, after the permission check (see module doc)."""
    return refusing_outside(_read, path, allow_insecure)


def _read(path: Path, allow_insecure: bool) -> tuple[SecretText, tuple[int, int, int]]:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)      # follows symlinks: a mounted secret is one
    except FileNotFoundError:
        raise Refusal(f"keyring file {path} does not exist", KeyringRequired) from None
    except IsADirectoryError:
        raise Refusal(f"keyring {path} is a directory, not a keyring file") from None
    except OSError as exc:
        raise Refusal(f"keyring file {path} cannot be read: {type(exc).__name__}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refusal(f"keyring {path} is a directory, not a keyring file")
        if not stat.S_ISREG(st.st_mode):
            raise Refusal(f"keyring {path} is not a regular file")
        try:
            check_permissions(path, st)
        except ConfigurationError as exc:
            if not allow_insecure:
                raise Refusal(str(exc)) from None
            # opted out: loaded, but never without a word (the path and mode are no secret)
            logger.warning("loading keyring file %s although group or others can use it or "
                           "another user owns it (mode %04o, owner uid %d): permission check "
                           "disabled by allow_insecure_permissions / %s", path,
                           stat.S_IMODE(st.st_mode), st.st_uid, INSECURE_ENV_VAR)
        if st.st_size > _MAX_FILE_BYTES:
            raise Refusal(f"keyring file {path} is {st.st_size} bytes; not a keyring file")
        return SecretText(_decode(_read_all(fd), path)), _stamp(st)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > _MAX_FILE_BYTES:
            raise Refusal("a keyring file is at most 16 MiB")


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:     # the error object holds every byte of the file
        pass
    raise Refusal(f"keyring file {path} cannot be read: it is not UTF-8 text")


def write_keyring_text(target: Path, text: SecretText) -> tuple[int, int, int]:
    """Atomically replace ``target`` by a 0600 file holding ``text``; returns its stamp.
    A symlink at ``target`` is refused (see module doc)."""
    refuse_symlink(target)
    fd, tmp = tempfile.mkstemp(prefix=".keyring-", dir=target.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text.reveal())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return file_stamp(target)


def refuse_symlink(target: Path) -> None:
    if target.is_symlink():
        raise ConfigurationError(
            f"keyring path {_where(target)} is a symlink; a keyring is never written through "
            "or over a symlink (it is usually a mounted secret: update the secret at its "
            "source, or save to the file it points to)")


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


@contextmanager
def file_lock(target: Path) -> Iterator[None]:
    """An exclusive advisory lock beside the keyring file, so processes that update it
    (rotation, shredding, recording a database) do not lose each other's changes."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock_path = target.with_name(target.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
