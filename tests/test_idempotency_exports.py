"""The public surface: a top level a newcomer can hold in their head (at most 24 names), the
idempotency API in its own subpackage (the README's imports)."""

from __future__ import annotations

import subprocess
import sys


def test_the_top_level_is_small_and_idempotency_has_its_own_package() -> None:
    import langgraph_securesaver as pkg
    from langgraph_securesaver import idempotency

    assert len(pkg.__all__) <= 24, pkg.__all__
    assert {"SecureSaver", "SecureStore", "Keyring", "RetentionPolicy", "tenant_scope",
            "SecureSaverError"} <= set(pkg.__all__)
    for name in ("idempotent", "current_idempotency_key", "recover_stalled", "Registry"):
        assert name not in pkg.__all__
        assert not hasattr(pkg, name)       # one path per name, no aliases
    assert {"idempotent", "current_idempotency_key", "is_replaying", "IdempotencyKeyReused",
            "arecover_stalled", "idempotent_tool_node"} <= set(idempotency.__all__)


def test_star_import_and_unknown_names() -> None:
    code = ("from langgraph_securesaver import *\n"
            "assert SecureSaver and Keyring and tenant_scope and TamperedDataError\n"
            "from langgraph_securesaver.idempotency import *\n"
            "assert idempotent and is_replaying and IdempotencyKeyReused\n"
            "import langgraph_securesaver as p\n"
            "try:\n    p.no_such_name\nexcept AttributeError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
