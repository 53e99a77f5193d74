"""A restored copy of a database cannot destroy its original's provider key by retiring.

A staging copy of the production database (a file copy: same database id, same key rows)
runs ``securesaver rotate-keys --retire-old`` against the same KMS alias / HSM key family.
Retiring only stops using the old key there: production's KMS key stays Enabled (it went to
PendingDeletion on main), production's HSM key object stays in the token (destroyed on main),
and production reads its turns. Destroying a provider key is a separate command that names
the key (``securesaver destroy-master-key``), refused while a key row of the database it runs
on is still wrapped under it, and refused for the current key.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from langgraph_securesaver.cli.main import app
from langgraph_securesaver.keys.urls import load_provider

from .provider_helpers import open_saver, say, texts


def _provider_url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "aws-kms":
        return f"aws-kms://{request.getfixturevalue('kms_alias')}"
    return str(request.getfixturevalue("pkcs11_url"))


def _exists(kind: str, url: str, version: str) -> bool:
    """Is the provider key still usable (KMS: Enabled; PKCS#11: the object is in the token)?"""
    if kind == "aws-kms":
        meta = boto3.client("kms").describe_key(KeyId=version)["KeyMetadata"]
        return bool(meta["KeyState"] == "Enabled")
    provider: Any = load_provider(url)
    return version in provider._scan()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("kind", ["aws-kms", "pkcs11"])
def test_a_restored_copy_cannot_destroy_its_originals_key(
        tmp_path: Path, request: pytest.FixtureRequest, kind: str) -> None:
    url = _provider_url(kind, request)
    prod, staging = tmp_path / "prod", tmp_path / "staging"
    prod.mkdir()
    staging.mkdir()
    with open_saver(prod, load_provider(url)) as saver:
        say(saver, "acme", "t", "production turn")
        first = saver.keyring.current_version
    shutil.copy(prod / "agent.db", staging / "agent.db")   # the restored copy

    rotated = _cli("rotate-keys", "--url", f"sqlite:///{staging / 'agent.db'}",
                   "--keyring", url, "--retire-old")
    assert rotated.exit_code == 0, rotated.output
    assert _exists(kind, url, first)          # production's key is untouched
    with open_saver(prod, load_provider(url)) as saver:
        assert "production turn" in texts(saver, "acme", "t")
        say(saver, "acme", "t", "production goes on")

    # destruction is explicit and names the key; refused while production's rows use it
    prod_url = f"sqlite:///{prod / 'agent.db'}"
    refused = _cli("destroy-master-key", "--url", prod_url, "--keyring", url, "--key", first)
    assert refused.exit_code == 2 and "still wraps" in refused.output, refused.output
    with open_saver(prod, load_provider(url)) as saver:
        current = saver.keyring.current_version
    refused = _cli("destroy-master-key", "--url", prod_url, "--keyring", url, "--key", current)
    assert refused.exit_code == 2 and "current" in refused.output, refused.output
    assert _exists(kind, url, first)
    # production moves its rows off the old key and retires it: the erasure epoch stays open
    # (the key exists) until production destroys it by name
    retired = _cli("rotate-keys", "--url", prod_url, "--keyring", url, "--retire-old")
    assert retired.exit_code == 0, retired.output
    assert _exists(kind, url, first)
    with open_saver(prod, load_provider(url)) as saver:
        assert first in saver.erasure_epoch()["held_masters"]
    done = _cli("destroy-master-key", "--url", prod_url, "--keyring", url, "--key", first)
    assert done.exit_code == 0, done.output
    assert not _exists(kind, url, first)
    with open_saver(prod, load_provider(url)) as saver:
        assert first not in saver.erasure_epoch()["held_masters"]
        saver.keys.forget()
        assert "production goes on" in texts(saver, "acme", "t")
