"""A real PKCS#11 token for tests: SoftHSM2 (Debian package ``softhsm2``) with a token directory
of the test run's own, initialised with ``softhsm2-util --init-token``. Removing a token is
what an HSM outage looks like to the module: the token's directory is moved away (and back)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import uuid
from pathlib import Path

MODULE_PATHS = ("/usr/lib/softhsm/libsofthsm2.so",
                "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
                "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
                "/usr/local/lib/softhsm/libsofthsm2.so")
TOKEN = "securesaver-test"
PIN_TOKEN = "securesaver-pin"
PIN_VAR = "SECURESAVER_TEST_HSM_PIN"


SPY_PATHS = ("/usr/lib/x86_64-linux-gnu/pkcs11/pkcs11-spy.so",
             "/usr/lib/aarch64-linux-gnu/pkcs11/pkcs11-spy.so",
             "/usr/lib/x86_64-linux-gnu/pkcs11-spy.so", "/usr/lib/pkcs11/pkcs11-spy.so")


def spy_path() -> str | None:
    """OpenSC's pkcs11-spy (Debian package ``opensc-pkcs11``): a PKCS#11 module that logs
    every call, then passes it to the module named by ``PKCS11SPY``."""
    return next((p for p in SPY_PATHS if os.path.exists(p)), None)


def spy_counts(log: Path) -> dict[str, int]:
    """How many times each C_ function was called, from a pkcs11-spy log."""
    import re
    counts: dict[str, int] = {}
    for name in re.findall(r"^\d+: (C_\w+)", log.read_text(errors="replace"), re.MULTILINE):
        counts[name] = counts.get(name, 0) + 1
    return counts


def module_path() -> str | None:
    return next((p for p in MODULE_PATHS if os.path.exists(p)), None)


def softhsm_missing() -> str | None:
    """Why SoftHSM2 cannot be used here, or None."""
    if shutil.which("softhsm2-util") is None or module_path() is None:
        return "SoftHSM2 is not installed (apt-get install softhsm2)"
    try:
        import pkcs11  # noqa: F401
    except ImportError:
        return "python-pkcs11 is not installed (pip install 'langgraph-securesaver[pkcs11]')"
    return None


class SoftHsm:
    """SoftHSM2 configured for this run (``SOFTHSM2_CONF``) with its tokens."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tokendir = root / "tokens"
        self.conf = root / "softhsm2.conf"
        self.module = module_path() or ""
        # long and unlike anything else, so a leak test can search reports for it
        self.pin = "pin-" + secrets.token_hex(12)
        self.token_dirs: dict[str, Path] = {}
        self._saved: dict[str, str | None] = {}

    def start(self) -> None:
        self.tokendir.mkdir(parents=True)
        self.conf.write_text(f"directories.tokendir = {self.tokendir}\n"
                             "objectstore.backend = file\nlog.level = ERROR\n"
                             "slots.removable = false\n")
        for var, value in (("SOFTHSM2_CONF", str(self.conf)), (PIN_VAR, self.pin)):
            self._saved[var] = os.environ.get(var)
            os.environ[var] = value
        for label in (TOKEN, PIN_TOKEN):
            self.init_token(label)

    def init_token(self, label: str) -> None:
        before = set(self.tokendir.iterdir())
        subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", label,
                        "--pin", self.pin, "--so-pin", "so-" + self.pin],
                       check=True, capture_output=True, env=dict(os.environ))
        (made,) = set(self.tokendir.iterdir()) - before
        self.token_dirs[label] = made

    def stop(self) -> None:
        for var, value in self._saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value

    def url(self, key_label: str, *, token: str = TOKEN, pin_var: str = PIN_VAR,
            module: str | None = None, extra: str = "") -> str:
        return (f"pkcs11://{token}/{key_label}?module={module or self.module}"
                f"&pin-env={pin_var}{extra}")

    def new_key_url(self, token: str = TOKEN) -> str:
        """Create a new AES key (a label of its own) in ``token``; its URL."""
        from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
        label = "k-" + uuid.uuid4().hex[:12]
        Pkcs11KeyProvider.create(token, label, module=self.module, pin_env=PIN_VAR)
        return self.url(label, token=token)

    def remove_token(self, label: str = TOKEN) -> None:
        """The token disappears from the module (as an unplugged or failed HSM does)."""
        self.token_dirs[label].rename(self.root / f"removed-{label}")

    def restore_token(self, label: str = TOKEN) -> None:
        (self.root / f"removed-{label}").rename(self.token_dirs[label])

    def break_module(self) -> None:
        """The module itself fails: its token directory is gone, so ``C_Initialize`` fails
        (as a module whose device, daemon or configuration became unreadable does)."""
        self.tokendir.rename(self.root / "tokens-away")

    def repair_module(self) -> None:
        (self.root / "tokens-away").rename(self.tokendir)
