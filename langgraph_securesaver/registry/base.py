"""What :class:`~.core.Registry` gives its base classes (:mod:`.thread_rows`, :mod:`.chains`,
:mod:`.wrapped_keys`, :mod:`.claims`, :mod:`.verify`): its engine, dialect and integrity
helper, its transactions and its dialect helpers, declared once for the type checker.
``Registry`` provides them; nothing here runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .integrity import RegistryIntegrity


class RegistryBase:
    """The attributes and methods of ``Registry`` that its base classes use."""

    engine: Engine
    dialect: str
    integrity: RegistryIntegrity

    if TYPE_CHECKING:  # provided by Registry (declared for the type checker only)
        def begin(self) -> AbstractContextManager[Connection]: ...

        def _keyed(self) -> RegistryIntegrity: ...

        def _insert_ignore(self, conn: Connection, table: sa.Table,
                           rows: Sequence[dict[str, Any]]) -> None: ...
