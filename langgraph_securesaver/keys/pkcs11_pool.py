"""The PKCS#11 plumbing of :mod:`.pkcs11_provider`: the PIN source, and the pool of sessions
each process keeps per module and token.

PKCS#11 login belongs to the process, not to a session, so every provider of a process shares
one pool (and one login) per module and token. A module that failed (token removed, device
error) is finalized and initialized again before its next use, once no session of it is in use.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, KeyProviderUnavailable
from .keyring_file import insecure_allowed
from .material import SecretText

_PIN_FILE_MAX = 4096
#: how long a thread waits for a free session before the token counts as unavailable
SESSION_WAIT = 30.0


def load_pkcs11() -> Any:
    try:
        import pkcs11
    except ImportError:
        raise ConfigurationError(
            "Pkcs11KeyProvider needs python-pkcs11: pip install "
            "'langgraph-securesaver[pkcs11]'") from None
    return pkcs11


# --- the PIN ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PinSource:
    """Where the user PIN is read from, at each login (so a changed secret is picked up
    without a restart) and each session taken from the pool (to compare it with the PIN this
    process logged in with): an environment variable or a file (owner-only, like a keyring
    file)."""

    env: str | None = None
    file: str | None = None

    def __post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ConfigurationError(
                "a PKCS#11 PIN comes from exactly one of pin-env=VAR or pin-file=PATH "
                "(never from the URL itself)")

    def read(self) -> SecretText:
        if self.env is not None:
            value = SecretText(os.environ.get(self.env, "").strip("\r\n"))
            if not value:
                raise ConfigurationError(f"the PKCS#11 PIN variable {self.env} is not set")
            return value
        return _read_pin_file(str(self.file))

    def __str__(self) -> str:
        return f"${self.env}" if self.env is not None else f"file {self.file}"


def _read_pin_file(path: str) -> SecretText:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        problem = type(exc).__name__
    else:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigurationError(f"PKCS#11 PIN file {path} is not a regular file")
            shared = st.st_mode & 0o077 or (hasattr(os, "getuid") and st.st_uid != os.getuid())
            if shared and not insecure_allowed(None):
                raise ConfigurationError(
                    f"PKCS#11 PIN file {path} has mode {stat.S_IMODE(st.st_mode):04o} and "
                    f"owner uid {st.st_uid}: it must be readable by this process's user only "
                    "(chmod 600; for a read-only secret mount set "
                    "SECURESAVER_ALLOW_INSECURE_KEYRING=1, as for keyring files)")
            value = SecretText(os.read(fd, _PIN_FILE_MAX + 1).decode("utf-8", "replace")
                               .strip("\r\n"))
        finally:
            os.close(fd)
        if not value or len(value) > _PIN_FILE_MAX:
            raise ConfigurationError(f"PKCS#11 PIN file {path} is empty or too long")
        return value
    raise ConfigurationError(f"PKCS#11 PIN file {path} cannot be read ({problem})")


_SALT = secrets.token_bytes(16)


def pin_digest(pin: SecretText) -> bytes:
    """A per-process salted digest, to tell PINs apart without keeping one."""
    return hashlib.sha256(_SALT + pin.reveal().encode("utf-8")).digest()


# --- the shared session pools -----------------------------------------------------------------
class SessionEntry:
    """One open session and the key objects found through it."""

    __slots__ = ("generation", "keys", "session")

    def __init__(self, session: Any, generation: int) -> None:
        self.session = session
        self.keys: dict[str, Any] = {}
        self.generation = generation

    def __repr__(self) -> str:
        return f"<pkcs11 session, {len(self.keys)} key handles>"


class TokenPool:
    """The sessions of one token in one process, and its login state."""

    def __init__(self, module: ModulePool, label: str) -> None:
        self.module = module
        self.label = label
        self.idle: list[SessionEntry] = []
        self.opened = 0
        self.generation = -1
        self.logged_in_with: bytes | None = None
        self.refused_pins: set[bytes] = set()
        self.cond = threading.Condition()

    def __repr__(self) -> str:
        return f"<pkcs11 token {self.label!r}, {self.opened} sessions>"

    def take(self, pins: PinSource, max_sessions: int,
             count: Callable[[str], None]) -> SessionEntry:
        with self.cond:
            if self.generation != self.module.generation:   # the module was re-initialized
                self.idle, self.opened = [], 0
                self.logged_in_with = None
                self.generation = self.module.generation
            while True:
                if self.idle:
                    entry = self.idle.pop()
                    if self.logged_in_with is not None:
                        self._same_pin(pins)
                    return entry
                if self.opened < max_sessions:
                    break
                if not self.cond.wait(SESSION_WAIT):
                    raise KeyProviderUnavailable(
                        f"PKCS#11 token {self.label!r}: all {max_sessions} sessions stayed busy "
                        f"for {SESSION_WAIT:.0f} s")
            entry = SessionEntry(self._open(pins, count), self.generation)
            self.opened += 1
            return entry

    def _same_pin(self, pins: PinSource) -> None:
        """Login is per process: a provider whose PIN differs from the one this process
        logged in with is refused (it would otherwise work without its PIN being checked)."""
        digest = pin_digest(pins.read())
        if digest != self.logged_in_with:
            raise KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r}: this process is logged in with a different "
                f"PIN than the one in {pins}; one process uses one PIN per token")

    def _open(self, pins: PinSource, count: Callable[[str], None]) -> Any:
        """Open a read-write session; log in when this process is not logged in yet. A PIN
        the token refused is never tried again (HSMs lock the PIN after a few tries)."""
        pkcs11 = load_pkcs11()
        lib = self.module.lib
        failure: Exception | None = None
        try:
            count("GetToken")
            token = lib.get_token(token_label=self.label)
        except pkcs11.exceptions.NoSuchToken:
            failure = KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r} is not present in module {self.module.so} "
                "(removed, not initialized, or another label)")
        except pkcs11.exceptions.PKCS11Error as exc:
            failure = KeyProviderUnavailable(
                f"PKCS#11 module {self.module.so} failed listing tokens ({error_name(exc)})")
        if failure is not None:    # the module rescans its tokens when next used
            self.module.fail(self.module.generation)
            raise failure
        if self.logged_in_with is not None:
            self._same_pin(pins)
            count("OpenSession")
            return self._guarded(lambda: token.open(rw=True), pkcs11)
        digest = pin_digest(pins.read())
        if digest in self.refused_pins:
            raise KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r} refused the PIN in {pins} before; it is not "
                "tried again (fix the PIN; HSMs lock it after a few wrong tries)")
        count("Login")
        try:
            session = token.open(rw=True, user_pin=pins.read().reveal())
        except pkcs11.exceptions.UserAlreadyLoggedIn:   # logged in by other code in the process
            session = None
        except (pkcs11.exceptions.PinIncorrect, pkcs11.exceptions.PinInvalid,
                pkcs11.exceptions.PinLenRange):
            self.refused_pins.add(digest)
            failure = KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r} refused the PIN in {pins} (wrong PIN)")
        except pkcs11.exceptions.PinLocked:
            failure = KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r}: the user PIN is locked (the token's security "
                "officer must unlock it)")
        except pkcs11.exceptions.PKCS11Error as exc:
            failure = KeyProviderUnavailable(
                f"PKCS#11 token {self.label!r}: opening a session failed ({error_name(exc)})")
        if failure is not None:
            raise failure
        self.logged_in_with = digest
        if session is None:
            return self._guarded(lambda: token.open(rw=True), pkcs11)
        return session

    def _guarded(self, opener: Callable[[], Any], pkcs11: Any) -> Any:
        try:
            return opener()
        except pkcs11.exceptions.PKCS11Error as exc:
            problem = error_name(exc)
        raise KeyProviderUnavailable(
            f"PKCS#11 token {self.label!r}: opening a session failed ({problem})")

    def give_back(self, entry: SessionEntry) -> None:
        with self.cond:
            if entry.generation == self.generation == self.module.generation:
                self.idle.append(entry)
            self.cond.notify()


class ModulePool:
    """A loaded PKCS#11 module; re-initialized (``C_Finalize``/``C_Initialize``) after a
    failure, once no session of it is in use."""

    def __init__(self, so: str) -> None:
        self.so = so
        self._lib: Any = None
        self.generation = 0
        self.broken = False
        self.users = 0
        self.resetting = False
        self.cond = threading.Condition()
        self.tokens: dict[str, TokenPool] = {}
        # python-pkcs11 initializes modules without locking arguments (C_Initialize(NULL)),
        # which by the standard lets a module assume one thread at a time (SoftHSM2 then
        # drops its own mutexes): every call into the module is made under this lock
        self.serial = threading.RLock()

    def __repr__(self) -> str:
        return f"<pkcs11 module {self.so}>"

    @property
    def lib(self) -> Any:
        return self._lib

    def token(self, label: str) -> TokenPool:
        with self.cond:
            found = self.tokens.get(label)
            if found is None:
                found = self.tokens[label] = TokenPool(self, label)
            return found

    def enter(self, count: Callable[[str], None]) -> None:
        with self.cond:
            while self.resetting:
                self.cond.wait()
            if self._lib is None or self.broken:
                self.resetting = True
                try:
                    while self.users:
                        self.cond.wait()
                    self._start(count)
                finally:
                    self.resetting = False
                    self.cond.notify_all()
            self.users += 1

    def leave(self) -> None:
        with self.cond:
            self.users -= 1
            self.cond.notify_all()

    def fail(self, generation: int) -> None:
        """A session of ``generation`` met a device failure: re-initialize before next use."""
        with self.cond:
            if generation == self.generation:
                self.broken = True

    def _start(self, count: Callable[[str], None]) -> None:
        pkcs11 = load_pkcs11()
        problem = ""
        try:
            if self._lib is None:
                count("Initialize")
                self._lib = pkcs11.lib(self.so)
            else:
                count("Initialize")
                self._lib.reinitialize()
        except pkcs11.exceptions.PKCS11Error as exc:
            problem = f"{error_name(exc)}: {exc}"[:300]
        except OSError as exc:
            problem = type(exc).__name__
        if problem:
            self.broken = True
            raise KeyProviderUnavailable(
                f"PKCS#11 module {self.so} could not be loaded or initialized ({problem})")
        self.generation += 1
        self.broken = False


_MODULES: dict[str, ModulePool] = {}
_MODULES_LOCK = threading.Lock()


def module_pool(so: str) -> ModulePool:
    with _MODULES_LOCK:
        found = _MODULES.get(so)
        if found is None:
            found = _MODULES[so] = ModulePool(so)
        return found


def _after_fork_in_child() -> None:
    """A forked child (a pre-forking server's worker) inherits the parent's sessions and
    login, which PKCS#11 does not carry across a fork: every module is initialized again
    before the child's first use, with fresh locks (another thread may have held them)."""
    global _MODULES_LOCK
    _MODULES_LOCK = threading.Lock()
    for module in _MODULES.values():
        module.cond = threading.Condition()
        module.serial = threading.RLock()
        module.users, module.resetting, module.broken = 0, False, True
        for token in module.tokens.values():
            token.cond = threading.Condition()
            token.idle, token.opened, token.logged_in_with = [], 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def error_name(exc: BaseException) -> str:
    return type(exc).__name__
