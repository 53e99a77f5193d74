"""Raw rows of SecureSaver's own tables (and companions'), reflected from the database.

The at-rest scan and re-encryption read every ``securesaver_*`` table, including tables of
companions this version does not know, and rewrite a sealed column in place. This module is
that layer: reflect the tables and sort their columns by what they hold, page through their
rows in primary-key order, and compare-and-swap updates (a row changed meanwhile is left
alone). The inner saver's tables are :mod:`.raw_tables`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .raw_sql import DEFAULT_PAGE

REGISTRY_TABLE_PREFIX = "securesaver_"


@dataclass(frozen=True)
class RegistryTable:
    """A reflected ``securesaver_*`` table with its columns sorted by what they hold."""

    table: sa.Table
    key_columns: tuple[str, ...]
    text_columns: tuple[str, ...]
    binary_columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return str(self.table.name)


def _python_type(column: sa.Column[Any]) -> type | None:
    try:
        return column.type.python_type
    except NotImplementedError:
        return None


def registry_tables(engine: Engine) -> list[RegistryTable]:
    """Every ``securesaver_*`` table in the registry database (known to this version or not)."""
    reflected = sa.MetaData()
    reflected.reflect(engine, only=lambda name, _meta: name.startswith(REGISTRY_TABLE_PREFIX))
    out = []
    for table in sorted(reflected.tables.values(), key=lambda t: t.name):
        text, binary = [], []
        for column in table.columns:
            kind = _python_type(column)
            if kind is bytes:
                binary.append(column.name)
            elif kind in (str, dict, list):
                text.append(column.name)
        keys = tuple(c.name for c in table.primary_key.columns) or tuple(
            c.name for c in table.columns)
        out.append(RegistryTable(table, keys, tuple(text), tuple(binary)))
    return out


def count_rows(engine: Engine, table: RegistryTable) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table.table)).scalar()
                   or 0)


def registry_rows(engine: Engine, table: RegistryTable, page: int = DEFAULT_PAGE
                  ) -> Iterator[list[dict[str, Any]]]:
    """Pages of a registry table's rows (dicts), in primary-key order (keyset pagination;
    a table without a primary key is paged by offset)."""
    cols = [table.table.c[name] for name in table.key_columns]
    keyed = bool(table.table.primary_key.columns)
    after: tuple[Any, ...] | None = None
    offset = 0
    while True:
        q = sa.select(table.table).order_by(*cols).limit(page)
        if not keyed:
            q = q.offset(offset)
        elif after is not None:
            q = q.where(sa.tuple_(*cols) > sa.tuple_(*after))
        with engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(q).mappings()]
        if not rows:
            return
        after = tuple(rows[-1][name] for name in table.key_columns)
        offset += len(rows)
        yield rows
        if len(rows) < page:
            return


# wrapped by the key provider, not by a tenant data key: never a token
WRAPPED_KEY_COLUMNS = frozenset({("securesaver_tenant_keys", "wrapped"),
                                 ("securesaver_thread_keys", "wrapped"),
                                 ("securesaver_pii_keys", "wrapped"),
                                 ("securesaver_store_keys", "wrapped")})


@dataclass(frozen=True)
class RegistryChange:
    """Set ``column`` of the row with primary key ``key`` to ``new`` if it still holds ``old``."""

    key: Mapping[str, Any]
    column: str
    old: Any
    new: Any


def cas_update_registry(engine: Engine, table: sa.Table, changes: list[RegistryChange]
                        ) -> list[bool]:
    """``UPDATE table SET column = new WHERE <key> AND column = old`` for each change, in one
    transaction (compare-and-swap: a row changed meanwhile is left alone). Returns, per
    change, whether it was applied."""
    applied = []
    with engine.begin() as conn:
        for change in changes:
            where = [table.c[name] == value for name, value in change.key.items()]
            where.append(table.c[change.column] == change.old)
            stmt = table.update().where(*where).values({change.column: change.new})
            applied.append(conn.execute(stmt).rowcount == 1)
    return applied
