"""The idempotency API is importable from the top-level package (the README's imports)."""

from __future__ import annotations

import subprocess
import sys


def test_top_level_imports_are_the_subpackage_objects() -> None:
    from langgraph_securesaver import (
        IdempotencyKeyReused,
        arecover_stalled,
        current_idempotency_key,
        idempotent,
        is_replaying,
    )
    from langgraph_securesaver import idempotency as sub

    assert idempotent is sub.idempotent
    assert current_idempotency_key is sub.current_idempotency_key
    assert is_replaying is sub.is_replaying
    assert IdempotencyKeyReused is sub.IdempotencyKeyReused
    assert arecover_stalled is sub.arecover_stalled
    import langgraph_securesaver as pkg
    assert {"idempotent", "current_idempotency_key", "is_replaying",
            "IdempotencyKeyReused"} <= set(pkg.__all__)


def test_star_import_and_unknown_names() -> None:
    code = ("from langgraph_securesaver import *\n"
            "assert idempotent and is_replaying and IdempotencyKeyReused\n"
            "import langgraph_securesaver as p\n"
            "try:\n    p.no_such_name\nexcept AttributeError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
