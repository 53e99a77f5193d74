"""Shared fixtures: keyrings, savers on every backend, and the real PostgreSQL server.

Postgres tests run against the server at SECURESAVER_TEST_PG (default
postgresql://postgres@127.0.0.1:5432/test). Without a server they skip with the reason,
except under CI=true, where a missing server is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from langgraph_securesaver import Keyring
from langgraph_securesaver.cli.common import get_console

from .boundary_helpers import Raw

T = TypeVar("T")

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

# The CLI makes its rich consoles on first use (one command per process). Tests run many
# commands in one process, several with COLUMNS set for one call: a console made inside such
# a call would keep that width for the rest of the session. Made here, at start-up, the
# consoles read the terminal width per call.
get_console()
get_console(stderr=True)


def _pg_available() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'langgraph-securesaver[postgres]')"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"PostgreSQL not reachable at {PG_URL}: {exc}"


_PG_REASON = _pg_available()


def require_postgres() -> None:
    if _PG_REASON is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires PostgreSQL: {_PG_REASON}")
    pytest.skip(_PG_REASON)


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.generate()


def new_pg_schema() -> str:
    import psycopg
    name = "ss_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def drop_pg_schema(name: str) -> None:
    import psycopg
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_url_in(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    require_postgres()
    schema = new_pg_schema()
    try:
        yield pg_url_in(schema)
    finally:
        drop_pg_schema(schema)


def pg_clone_available() -> bool:
    """pg_dump and psql are on PATH (what :func:`copy_database` needs for PostgreSQL)."""
    return shutil.which("pg_dump") is not None and shutil.which("psql") is not None


def schema_of(url: str) -> str:
    """The schema of a URL made by :func:`pg_url_in`."""
    return url.rsplit("search_path%3D", 1)[1]


def copy_database(source: str, target: str) -> None:
    """Copy the database at URL ``source`` (not written to meanwhile) to ``target``: a SQLite
    file (by SQLite's backup API) or a PostgreSQL schema of :func:`pg_url_in` (an empty one,
    e.g. ``pg_url``'s: tables, indexes, sequences and rows, by pg_dump and psql). For modules
    that seed one database once and hand each test a copy of it."""
    if source.startswith("sqlite:///"):
        src = sqlite3.connect(source.removeprefix("sqlite:///"))
        dst = sqlite3.connect(target.removeprefix("sqlite:///"))
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return
    old, new = schema_of(source), schema_of(target)
    dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "--schema", old, PG_URL],
                          capture_output=True, text=True, check=True).stdout
    # schema names are "ss_" + 12 random hex digits: one can only be the schema's own name
    dump = re.sub(rf"^CREATE SCHEMA {old};$", "", dump, flags=re.M).replace(old, new)
    restored = subprocess.run(["psql", "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1",
                               PG_URL], input=dump, capture_output=True, text=True)
    if restored.returncode != 0:
        raise RuntimeError(f"copying schema {old} to {new} failed: {restored.stderr[-2000:]}")


class Seeds:
    """Databases a module seeds once (``seed(url)`` writes one and returns what the tests need
    with it, e.g. its keyring) and copies for each test (:func:`copy_database`): the writes,
    and the lease fence a deletion of just-written threads waits out, are not repeated per
    test. Without pg_dump/psql a PostgreSQL test is seeded itself, as before."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: dict[object, tuple[str, object]] = {}

    def copy(self, key: object, seed: Callable[[str], T], target: str) -> T:
        """The seed ``key`` (made by ``seed`` on first use) copied to the URL ``target``."""
        if not target.startswith("sqlite:") and not pg_clone_available():
            return seed(target)
        if key not in self.made:
            url = (f"sqlite:///{self.directory / f'seed-{len(self.made)}.db'}"
                   if target.startswith("sqlite:") else pg_url_in(new_pg_schema()))
            self.made[key] = (url, None)
            self.made[key] = (url, seed(url))
        url, value = self.made[key]
        copy_database(url, target)
        return value  # type: ignore[return-value]

    def drop(self) -> None:
        for url, _value in self.made.values():
            if not url.startswith("sqlite:"):
                drop_pg_schema(schema_of(url))


@pytest.fixture(scope="module")
def db_seeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeds]:
    """The module's :class:`Seeds`; PostgreSQL seeds are dropped at the module's end."""
    made = Seeds(tmp_path_factory.mktemp("seeds"))
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Raw]:
    """``(url, raw)``: a fresh SQLite file or PostgreSQL schema (through ``pg_url``: skipped
    without a server, failed under CI=true), and raw SQL on it (``raw.backend``, ``raw.where``:
    the file's path or the URL). Parametrize ``database`` indirectly to pick one backend."""
    if request.param == "sqlite":
        db = tmp_path / "agent.db"
        return f"sqlite:///{db}", Raw("sqlite", db)
    url = request.getfixturevalue("pg_url")
    return url, Raw("postgres", url)


# --- a real KMS endpoint (moto's server over HTTP on loopback) -------------------------------
@pytest.fixture(scope="session")
def moto_server() -> Iterator[int]:
    """moto's standalone server (a real HTTP KMS API) on a free loopback port; its port."""
    import logging

    from moto.server import ThreadedMotoServer

    from .kms_helpers import free_port
    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield port
    finally:
        server.stop()


def _point_boto3_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """boto3's usual environment (AWS_ENDPOINT_URL, credentials, region) aimed at ``url``."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_KMS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _new_kms_alias() -> str:
    """A new KMS key behind a new alias (moto's state is shared by the session)."""
    import boto3
    kms = boto3.client("kms")
    key = kms.create_key(Description="securesaver test")["KeyMetadata"]["KeyId"]
    alias = f"alias/securesaver-{uuid.uuid4().hex[:12]}"
    kms.create_alias(AliasName=alias, TargetKeyId=key)
    return alias


@pytest.fixture
def kms_endpoint(moto_server: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A counting proxy in front of the server; boto3 is configured through its usual
    environment (AWS_ENDPOINT_URL, credentials, region) to reach it."""
    from .kms_helpers import CountingProxy
    proxy = CountingProxy(moto_server)
    proxy.start()
    _point_boto3_at(monkeypatch, proxy.url)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def kms_alias(kms_endpoint: object) -> str:
    """A new KMS key behind a new alias (moto's state is shared by the session)."""
    alias = _new_kms_alias()
    kms_endpoint.reset()  # type: ignore[attr-defined]
    return alias




# --- MariaDB and Redis started by the tests, on ports of their own (tests/servers.py) -------
@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from .servers import start_mariadb
    server = start_mariadb(tmp_path_factory.mktemp("mariadb"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from .servers import start_redis
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


# --- a real PKCS#11 token (SoftHSM2, initialised here for this test run) ----------------------
@pytest.fixture(scope="session")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """SoftHSM2 with a token directory of this run's own (``SOFTHSM2_CONF`` points at it before
    the module is loaded) and two tokens: "securesaver-test" for the saver's tests and
    "securesaver-pin" for the PIN tests. Skipped without softhsm2 (failed under CI=true)."""
    from .hsm_helpers import SoftHsm, softhsm_missing
    missing = softhsm_missing()
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires SoftHSM2: {missing}")
        pytest.skip(missing)
    hsm = SoftHsm(tmp_path_factory.mktemp("softhsm"))
    hsm.start()
    try:
        yield hsm
    finally:
        hsm.stop()


@pytest.fixture
def pkcs11_url(softhsm: object) -> str:
    """A pkcs11:// URL naming a new AES key (its own label) in the test token."""
    return softhsm.new_key_url()  # type: ignore[attr-defined]


@pytest.fixture(scope="module", params=["keyring", "aws-kms", "pkcs11"])
def module_key_provider(request: pytest.FixtureRequest) -> Iterator[object]:
    """As ``key_provider``, one per module and provider: for modules that build one database
    per provider and hand each test a copy of it (the tests' own attacks differ, the
    seeded conversation does not)."""
    if request.param == "keyring":
        yield Keyring.generate()
        return
    if request.param == "pkcs11":
        from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
        yield Pkcs11KeyProvider.from_url(request.getfixturevalue("softhsm").new_key_url())
        return
    from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider
    with pytest.MonkeyPatch.context() as monkeypatch:
        _point_boto3_at(monkeypatch,
                        f"http://127.0.0.1:{request.getfixturevalue('moto_server')}")
        yield AwsKmsKeyProvider(_new_kms_alias())


@pytest.fixture(params=["keyring", "aws-kms", "pkcs11"])
def key_provider(request: pytest.FixtureRequest) -> object:
    """Each key provider the saver's tests run over: a fresh Keyring, an AwsKmsKeyProvider
    on its own KMS key (moto's server, see ``kms_alias``), and a Pkcs11KeyProvider on its own
    key in a SoftHSM2 token (see ``softhsm``)."""
    if request.param == "keyring":
        return Keyring.generate()
    if request.param == "pkcs11":
        from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
        return Pkcs11KeyProvider.from_url(request.getfixturevalue("pkcs11_url"))
    from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider
    return AwsKmsKeyProvider(request.getfixturevalue("kms_alias"))
