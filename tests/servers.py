"""MariaDB and Redis servers started by the tests themselves, on ports of their own.

Each xdist worker starts its own (``mariadbd`` in a temporary data directory, ``redis-server``
without persistence) the first time a test asks, and stops it at the end of the session. The
binaries come from Debian's ``mariadb-server`` and ``redis-server`` packages (``.ci/run``
installs them). Without them a test skips with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def _worker_offset() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = "".join(c for c in worker if c.isdigit())
    return int(digits or 0)


def missing_or_fail(what: str, reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires {what}: {reason}")
    pytest.skip(reason)


def _free_port(preferred: int) -> int:
    for port in range(preferred, preferred + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {preferred}")


def _wait(check: object, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log.read_text(errors='replace')[-2000:]}")
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start: {log.read_text(errors='replace')[-2000:]}")


@dataclass
class MariaDb:
    port: int
    proc: subprocess.Popen[bytes]
    counter: int = 0

    def new_database(self) -> str:
        """A fresh database; returns its mysql:// URL (root, no password)."""
        import pymysql
        self.counter += 1
        name = f"t{os.getpid()}_{self.counter}"
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        conn.close()
        return f"mysql://root@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_mariadb(base: Path) -> MariaDb:
    mariadbd = shutil.which("mariadbd") or (
        "/usr/sbin/mariadbd" if Path("/usr/sbin/mariadbd").exists() else None)
    install = shutil.which("mariadb-install-db")
    if mariadbd is None or install is None:
        missing_or_fail("MariaDB", "mariadbd / mariadb-install-db not found "
                        "(apt-get install mariadb-server)")
    try:
        import pymysql  # noqa: F401
    except ImportError:
        missing_or_fail("PyMySQL", "pymysql is not installed (pip install -e '.[test]')")
    data = base / "mariadb"
    data.mkdir()
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run([install, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
                    "--skip-test-db", *user], check=True, capture_output=True)
    port = _free_port(33306 + 20 * _worker_offset())
    log = base / "mariadb.log"
    tmp = base / "tmp"   # its own temporary tables (not /tmp, shared with other servers)
    tmp.mkdir()
    proc = subprocess.Popen(
        [mariadbd, "--no-defaults", f"--datadir={data}", f"--port={port}",
         "--bind-address=127.0.0.1", f"--socket={base / 'mariadb.sock'}",
         f"--pid-file={base / 'mariadb.pid'}", f"--log-error={log}", f"--tmpdir={tmp}",
         "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
         "--skip-log-bin", "--innodb-flush-log-at-trx-commit=2", *user],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log.touch()

    def ready() -> bool:
        import pymysql
        pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=1).close()
        return True
    _wait(ready, "mariadbd", proc, log)
    return MariaDb(port, proc)


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        import redis
        redis.Redis(port=self.port).flushall()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_redis(base: Path) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        missing_or_fail("Redis", "redis-server not found (apt-get install redis-server)")
    port = _free_port(36379 + 20 * _worker_offset())
    log = base / "redis.log"
    log.touch()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(base), "--logfile", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        import redis
        return bool(redis.Redis(port=port, socket_connect_timeout=1).ping())
    _wait(ready, "redis-server", proc, log)
    return RedisServer(port, proc)
