"""Keyring file hygiene: who may read the file, symlinks, and never losing a keyring.

Loading refuses a file group/others can read or write, or another user owns (unless the
caller opts out); saving refuses a symlink and an existing file (unless ``overwrite=True``),
and never replaces the file of another keyring that serves databases.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver
from tests.fake_agent import build_chat_graph

INSECURE_ENV_VAR = "SECURESAVER_ALLOW_INSECURE_KEYRING"

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _cli() -> object:
    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401 - registers the commands
    from langgraph_securesaver.cli.main import app
    return app


def _db_with(ring_path: Path, tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path)) as saver:
        build_chat_graph(saver).invoke(
            {"messages": [HumanMessage("hi")]},
            {"configurable": {"thread_id": "t", "tenant_id": "acme"}})
    return url


@pytest.fixture(autouse=True)
def _no_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSECURE_ENV_VAR, raising=False)


# --------------------------------------------------------------------------------------------
# loading: mode and owner
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o700])
def test_a_keyring_others_can_touch_is_refused_with_its_path_and_mode(
        mode: int, tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    path.chmod(mode)
    if not mode & 0o077:                   # 0700: only the owner (exec bit is harmless)
        assert Keyring.from_file(path).versions() == ["1"]
        return
    with pytest.raises(ConfigurationError) as info:
        Keyring.from_file(path)
    message = str(info.value)
    assert str(path) in message and f"{mode:04o}" in message and "chmod 600" in message
    assert "allow_insecure_permissions" in message and INSECURE_ENV_VAR in message
    with pytest.raises(ConfigurationError, match=f"{mode:04o}"):
        Keyring.load(path)
    # every way of loading it: SecureSaver(keyring=path), from_url, the CLI
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with pytest.raises(ConfigurationError, match=f"{mode:04o}"):
        with SecureSaver.from_url(url, keyring=path):
            pass
    assert not (tmp_path / "db.sqlite").exists()      # refused before the database is made
    (tmp_path / "db.sqlite").touch()
    for command in (["scan"], ["audit"], ["rotate-keys"], ["prune"]):
        result = CliRunner().invoke(_cli(), [*command, "--url", url, "--keyring", str(path)])
        assert result.exit_code == 2, (command, result.output)
        assert f"{mode:04o}" in result.stderr and str(path) in result.stderr


def test_the_opt_out_loads_an_insecure_file(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    path.chmod(0o644)
    assert Keyring.from_file(path, allow_insecure_permissions=True).versions() == ["1"]
    with pytest.raises(ConfigurationError):
        Keyring.from_file(path, allow_insecure_permissions=False)
    monkeypatch.setenv(INSECURE_ENV_VAR, "1")
    ring = Keyring.from_file(path)
    # an explicit False wins over the environment
    with pytest.raises(ConfigurationError):
        Keyring.from_file(path, allow_insecure_permissions=False)
    # the CLI honours the environment too
    url = _db_with(_secure_copy(path, tmp_path), tmp_path)
    result = CliRunner().invoke(_cli(), ["scan", "--url", url, "--keyring", str(path)])
    assert result.exit_code in (0, 1), result.output
    # a reload keeps the opt-out it was loaded with
    other = Keyring.from_file(path)
    other.add_version()
    other_path = tmp_path / "other.json"
    other.save(other_path)
    os.replace(other_path, path)
    path.chmod(0o644)
    monkeypatch.delenv(INSECURE_ENV_VAR)
    assert ring.reload() is True and ring.versions() == ["1", "2"]


def _secure_copy(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "secure-copy.json"
    Keyring.from_file(path, allow_insecure_permissions=True).save(copy)
    return copy


def test_a_file_that_becomes_insecure_is_not_reloaded(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    running = Keyring.from_file(path)
    operator = Keyring.from_file(path)
    operator.add_version()
    operator.persist()
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING):
        assert running.reload() is False
    assert running.versions() == ["1"] and "0666" in caplog.text


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_a_keyring_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    os.chown(path, 4242, 4242)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(ConfigurationError) as info:
        Keyring.from_file(path)
    assert "uid 4242" in str(info.value) and str(path) in str(info.value)
    assert Keyring.from_file(path, allow_insecure_permissions=True).versions() == ["1"]


def _kubernetes_mount(tmp_path: Path, ring: Keyring, mode: int = 0o644) -> Path:
    """The layout of a Kubernetes secret volume: keyring.json -> ..data/keyring.json,
    ..data -> ..2026_01_01_00_00_00.1/, the file itself 0644."""
    mount = tmp_path / "secret"
    stamp = mount / "..2026_01_01_00_00_00.1"
    stamp.mkdir(parents=True)
    real = ring.save(stamp / "keyring.json")
    real.chmod(mode)
    (mount / "..data").symlink_to(stamp.name)
    link = mount / "keyring.json"
    link.symlink_to("..data/keyring.json")
    return link


def test_a_kubernetes_style_secret_mount(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    ring = Keyring.generate()
    link = _kubernetes_mount(tmp_path, ring)
    with pytest.raises(ConfigurationError) as info:
        Keyring.from_file(link)
    message = str(info.value)
    assert str(link) in message and "..2026_01_01_00_00_00.1" in message and "0644" in message
    loaded = Keyring.from_file(link, allow_insecure_permissions=True)
    assert loaded.versions() == ["1"]
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    before = (link.resolve()).read_bytes()
    with caplog.at_level(logging.WARNING):
        with SecureSaver.from_url(url, keyring=loaded) as saver:   # records the database
            build_chat_graph(saver).invoke(
                {"messages": [HumanMessage("hi")]},
                {"configurable": {"thread_id": "t", "tenant_id": "acme"}})
    # the mounted secret is left alone: still a symlink, same bytes, and the reason logged
    assert link.is_symlink() and link.resolve().read_bytes() == before
    assert "symlink" in caplog.text
    with pytest.raises(ConfigurationError, match="symlink"):
        loaded.persist()
    assert link.is_symlink() and link.resolve().read_bytes() == before


def test_a_symlink_to_a_private_file_loads(tmp_path: Path) -> None:
    link = _kubernetes_mount(tmp_path, Keyring.generate(), mode=0o600)
    assert Keyring.from_file(link).versions() == ["1"]


def test_a_keyring_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "keyring.fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigurationError, match="not a regular file"):
        Keyring.from_file(fifo)                    # and does not block waiting for a writer
    with pytest.raises(ConfigurationError, match="directory"):
        Keyring.from_file(tmp_path)


# --------------------------------------------------------------------------------------------
# saving: symlinks, overwriting, the databases a file records
# --------------------------------------------------------------------------------------------
def test_save_refuses_a_symlink_and_leaves_it(tmp_path: Path) -> None:
    target = Keyring.generate().save(tmp_path / "real.json")
    before = target.read_bytes()
    link = tmp_path / "keyring.json"
    link.symlink_to(target)
    for overwrite in (False, True):
        with pytest.raises(ConfigurationError, match="symlink"):
            Keyring.generate().save(link, overwrite=overwrite)
    assert link.is_symlink() and target.read_bytes() == before
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(ConfigurationError, match="symlink"):
        Keyring.generate().save(dangling)
    assert not (tmp_path / "nowhere.json").exists()


def test_save_refuses_an_existing_file_without_overwrite(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    before = path.read_bytes()
    with pytest.raises(ConfigurationError, match="overwrite=True"):
        Keyring.generate().save(path)
    ring = Keyring.from_file(path)
    ring.add_version()
    with pytest.raises(ConfigurationError, match="overwrite=True"):
        ring.save(path)                            # its own file too: persist() is the way
    assert path.read_bytes() == before
    ring.persist()
    assert Keyring.from_file(path).versions() == ["1", "2"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_overwriting_never_drops_a_recorded_database(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    stale_copy = Keyring.from_file(path).save(tmp_path / "before-the-database.json")
    _db_with(path, tmp_path)
    served = Keyring.from_file(path).databases()
    assert len(served) == 1 and not Keyring.from_file(stale_copy).databases()
    before = path.read_bytes()
    # another keyring over it: refused even with overwrite=True, naming the database
    with pytest.raises(ConfigurationError) as info:
        Keyring.generate().save(path, overwrite=True)
    assert "serves databases" in str(info.value)
    assert next(iter(served.values())) in str(info.value)
    assert path.read_bytes() == before
    # a stale copy of the same keyring (taken before the database was recorded) keeps it
    stale = Keyring.from_file(stale_copy)
    stale.add_version()
    stale.save(path, overwrite=True)
    assert Keyring.from_file(path).databases() == served
    assert Keyring.from_file(path).versions() == ["1", "2"]
    # a keyring file of other keys that serves nothing can be replaced deliberately
    spare = Keyring.generate().save(tmp_path / "spare.json")
    Keyring.generate().save(spare, overwrite=True)


def test_cli_keygen_refuses_to_replace_a_keyring_that_serves_a_database(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    _db_with(path, tmp_path)
    before = path.read_bytes()
    result = CliRunner().invoke(_cli(), ["keygen", "--out", str(path)])
    assert result.exit_code == 2 and "--force" in result.stderr
    result = CliRunner().invoke(_cli(), ["keygen", "--out", str(path), "--force"])
    assert result.exit_code == 2 and "serves databases" in result.stderr, result.output
    assert path.read_bytes() == before
    spare = Keyring.generate().save(tmp_path / "spare.json")
    result = CliRunner().invoke(_cli(), ["keygen", "--out", str(spare), "--force"])
    assert result.exit_code == 0, result.output
    link = tmp_path / "link.json"
    link.symlink_to(spare)
    result = CliRunner().invoke(_cli(), ["keygen", "--out", str(link), "--force"])
    assert result.exit_code == 2 and "symlink" in result.stderr


def test_cli_rotation_rewrites_its_own_file(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    url = _db_with(path, tmp_path)
    result = CliRunner().invoke(_cli(), ["rotate-keys", "--url", url, "--keyring", str(path)])
    assert result.exit_code == 0, result.output
    assert Keyring.from_file(path).current_version == "2"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["databases"]
