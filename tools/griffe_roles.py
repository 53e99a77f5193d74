"""A griffe extension for the API reference: docstrings are Google style but name other
objects with Sphinx roles (``:class:`~.keys.keyring.Keyring```), which mkdocstrings would
print literally; each role becomes inline code of the name it points to."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|ref):`([^`]+)`")


def _shown(target: str) -> str:
    """``~a.b.C`` -> ``C``; ``.a.b`` -> ``a.b``; ``text <target>`` -> ``text``."""
    if "<" in target and target.endswith(">"):
        return target.split("<", 1)[0].strip()
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip(".")


def plain_roles(text: str) -> str:
    return ROLE.sub(lambda m: f"`{_shown(m.group(1))}`", text)


try:
    import griffe
except ImportError:  # the docs extra is not installed (the tests import plain_roles only)
    pass
else:
    class SphinxRolesAsCode(griffe.Extension):
        def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = plain_roles(obj.docstring.value)
