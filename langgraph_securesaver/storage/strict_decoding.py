"""What a saver nobody here wrote must offer so that nothing stored is evaluated before it is
authenticated, checked when SecureSaver is built.

SecureSaver authenticates what it reads only *after* the inner saver has decoded its rows, so
the inner saver's decoding must evaluate nothing. A saver qualifies when every serializer it
decodes stored bytes with is the one it was handed (``serde``), which SecureSaver replaces by
the :class:`.strict_serde.StrictSerializer`:

* every serializer held by the saver, or by a saver it delegates to (an attribute holding a
  ``BaseCheckpointSaver``, as ``AsyncLMDBSaver`` keeps its sync twin): ``serde`` and any other
  instance attribute (SqliteSaver's unused ``jsonplus_serde``) are replaced on that instance;
* a serializer SecureSaver cannot replace for this saver alone (a class attribute, or a
  module-level serializer in the saver's own package, as
  langgraph-checkpoint-objectstorage decodes every file with ``envelope._serde``): cannot be
  replaced without changing the process for everyone, so the saver is refused with a
  :class:`~langgraph_securesaver.errors.ConfigurationError` naming it --
* unless the saver authenticates each stored object itself before decoding it (an AEAD under a
  key the storage never holds); :data:`SELF_AUTHENTICATING` names the savers known to do so
  and the setting that turns it on.

:func:`strict_plan` only looks: it returns the (saver, attribute) pairs to replace, so the
constructor applies nothing until every check has passed (:func:`apply_strict`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ..errors import ConfigurationError
from .strict_serde import StrictSerializer

__all__ = ["SELF_AUTHENTICATING", "apply_strict", "foreign_serializers", "strict_plan"]

Plan = list[tuple[BaseCheckpointSaver, str]]

#: savers that authenticate every stored object before their own (module-level) serializer
#: decodes it: "module.Class" -> (whether this instance does, the setting that turns it on)
SELF_AUTHENTICATING: dict[str, tuple[Callable[[Any], bool], str]] = {
    "langgraph_checkpoint_objectstorage.saver.ObjectStorageSaver": (
        lambda saver: vars(saver).get("_key_provider") is not None,
        "ObjectStorageSaver(..., encryption=<KeyProvider>): it then opens every object with "
        "AES-GCM before decoding it and refuses objects that were never encrypted"),
}

# LangGraph's own modules: the base classes and serializers every saver imports
_SHARED_MODULES = ("langgraph.checkpoint.base", "langgraph.checkpoint.serde",
                   "langgraph.checkpoint.memory", "langgraph_securesaver")


def is_serializer(value: Any) -> bool:
    return (not isinstance(value, type) and callable(getattr(value, "loads_typed", None))
            and callable(getattr(value, "dumps_typed", None)))


def _nested_savers(saver: BaseCheckpointSaver) -> Iterator[BaseCheckpointSaver]:
    """The saver and every saver it delegates to (attributes holding one), once each."""
    seen: set[int] = set()
    todo = [saver]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for value in vars(current).values():
            if isinstance(value, BaseCheckpointSaver):
                todo.append(value)


def _packages(saver: BaseCheckpointSaver) -> set[str]:
    """The packages that define the saver's classes (LangGraph's shared modules excluded)."""
    out: set[str] = set()
    for klass in type(saver).__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module == "builtins" or module.startswith(_SHARED_MODULES):
            continue
        out.add(module.rpartition(".")[0] or module)
    return out


def foreign_serializers(saver: BaseCheckpointSaver) -> list[str]:
    """The serializers reachable from ``saver`` that cannot be replaced on the instance
    (class attributes, module-level ones in its package): dotted names, for the refusal."""
    found: list[str] = []
    for current in _nested_savers(saver):
        for klass in type(current).__mro__:
            if (getattr(klass, "__module__", "") or "").startswith(_SHARED_MODULES):
                continue
            for attr, value in vars(klass).items():
                if attr != "serde" and is_serializer(value):
                    found.append(f"{klass.__name__}.{attr}")
        for package in _packages(current):
            for module_name, module in list(sys.modules.items()):
                if module is None or not (module_name == package
                                          or module_name.startswith(package + ".")):
                    continue
                for attr, value in list(vars(module).items()):
                    if is_serializer(value) and not isinstance(value, StrictSerializer):
                        found.append(f"{module_name}.{attr}")
    return sorted(set(found))


def _self_authenticating(saver: BaseCheckpointSaver) -> tuple[bool, str | None]:
    klass = type(saver)
    entry = SELF_AUTHENTICATING.get(f"{klass.__module__}.{klass.__qualname__}")
    if entry is None:
        return False, None
    check, how = entry
    return bool(check(saver)), how


def strict_plan(inner: BaseCheckpointSaver) -> Plan:
    """The (saver, attribute) pairs -- ``inner`` and the savers it delegates to, each one's
    serializers -- that SecureSaver replaces by the strict serializer; raises
    ConfigurationError for a saver that decodes stored bytes with a serializer SecureSaver
    cannot replace and does not authenticate them first."""
    foreign = foreign_serializers(inner)
    if foreign:
        authenticates, how = _self_authenticating(inner)
        if not authenticates:
            hint = (f"configure {how}" if how else
                    "use a saver that decodes only with the serde it is given")
            raise ConfigurationError(
                f"{type(inner).__name__} decodes stored data with a serializer SecureSaver "
                f"cannot replace ({', '.join(foreign)}): a row edited in its storage would be "
                "evaluated before SecureSaver authenticates it, so SecureSaver refuses to wrap "
                f"it; {hint} (docs/savers.md)")
    plan: Plan = []
    for saver in _nested_savers(inner):
        plan.append((saver, "serde"))
        plan.extend((saver, attr) for attr, value in vars(saver).items()
                    if attr != "serde" and is_serializer(value))
    return plan


def apply_strict(plan: Plan) -> None:
    """Install the strict serializer where a :func:`strict_plan` says."""
    for saver, attr in plan:
        if not isinstance(getattr(saver, attr, None), StrictSerializer):
            setattr(saver, attr, StrictSerializer())
