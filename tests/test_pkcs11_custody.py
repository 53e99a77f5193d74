"""Key custody in the PKCS#11 provider: only keys this provider made are adopted, and a
rotation's new key always becomes the current one.

The attack: with the application's HSM PIN, an attacker imports an AES key of a value they
chose, labelled ``<label>.v999999999``, sensitive and non-extractable. On main the provider
adopted it as the current master (it checked only those flags), so new key rows were wrapped
under a key whose value the attacker knows; ``rotate-keys --retire-old`` then generated
``<label>.v1000000000``, which never became current (its label did not parse), and destroyed
the real key. Here the imported key (``CKA_LOCAL`` false) and a key another tool generated in
the token (no key check value recorded) are ignored, the rotation's key is current, nothing is
wrapped under the attacker's keys, and the real key survives (retiring stops using it).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider

from .provider_helpers import open_saver, say, texts
from .test_pkcs11 import _any_session, _labels


def _import_key(hsm: Any, label: str) -> None:
    """The attacker's key: a value they know, imported sensitive and non-extractable."""
    import pkcs11
    attr = pkcs11.Attribute
    with _any_session(hsm.module, "securesaver-test") as s:
        s.create_object({
            attr.CLASS: pkcs11.ObjectClass.SECRET_KEY, attr.KEY_TYPE: pkcs11.KeyType.AES,
            attr.VALUE: secrets.token_bytes(32), attr.LABEL: label, attr.TOKEN: True,
            attr.PRIVATE: True, attr.SENSITIVE: True, attr.EXTRACTABLE: False,
            attr.ENCRYPT: True, attr.DECRYPT: True})


def _generate_elsewhere(hsm: Any, label: str) -> None:
    """A key generated in the token by another tool (CKA_LOCAL true, no key check value)."""
    import pkcs11
    attr = pkcs11.Attribute
    with _any_session(hsm.module, "securesaver-test") as s:
        s.generate_key(pkcs11.KeyType.AES, 256, label=label, store=True,
                       template={attr.PRIVATE: True, attr.SENSITIVE: True,
                                 attr.EXTRACTABLE: False})


def test_planted_keys_are_never_adopted_and_rotation_becomes_current(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    real = provider.current_version
    with open_saver(tmp_path, provider) as saver:
        say(saver, "acme", "t", "before the attack")
    _import_key(softhsm, f"{real}.v999999999")
    _generate_elsewhere(softhsm, f"{real}.v999999998")

    fresh = Pkcs11KeyProvider.from_url(pkcs11_url)    # a process started after the attack
    assert fresh.current_version == real
    assert fresh.versions() == [real]
    with open_saver(tmp_path, fresh) as saver:
        say(saver, "globex", "t", "a new tenant after the attack")
        assert {r.master_version for r in saver.registry.load_key_rows("globex")} == {real}
        report = saver.rotate_keys(retire_old=True)    # the documented incident step
        new = fresh.current_version
        assert new == f"{real}.v1000000000" == report.master_version
        assert report.retired == [real]
        for tenant in ("acme", "globex"):
            assert {r.master_version for r in saver.registry.load_key_rows(tenant)} == {new}
        saver.keys.forget()
        assert "before the attack" in texts(saver, "acme", "t")
    # the real key is not destroyed by retiring; the planted keys wrap nothing
    assert real in _labels(softhsm)
    again = Pkcs11KeyProvider.from_url(pkcs11_url)
    assert again.current_version == new
    assert f"{real}.v999999999" not in again.versions()
    assert f"{real}.v999999998" not in again.versions()
