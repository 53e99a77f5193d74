"""Where the registry's SQL differs between SQLite, PostgreSQL and MySQL/MariaDB: upserts,
insert-or-ignore, and statements that return the rows they changed.

Every statement of the registry is written once; the helpers here build its dialect's form.
MySQL and MariaDB have no ``UPDATE ... RETURNING`` (MySQL no ``DELETE ... RETURNING``
either): the rows are locked first (``SELECT ... FOR UPDATE``), changed by primary key, and
read back, all inside the caller's transaction, which is what ``RETURNING`` gives on the
others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

#: SQLAlchemy's names for the MySQL family (``mysql://`` and ``mariadb://`` URLs)
MYSQL = frozenset({"mysql", "mariadb"})

#: the dialects the registry runs on
SUPPORTED = frozenset({"sqlite", "postgresql", *MYSQL})


def insert(dialect: str, table: sa.Table) -> Any:
    """The dialect's own INSERT construct (it knows ON CONFLICT / ON DUPLICATE KEY)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert
        return pg_insert(table)
    if dialect in MYSQL:
        from sqlalchemy.dialects.mysql import insert as mysql_insert
        return mysql_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert
    return sqlite_insert(table)


def insert_ignore(conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ``rows``, leaving a row whose key exists as it is. On MySQL row by row, each a
    plain INSERT whose duplicate key is the answer (:func:`insert_if_absent`: a shared lock on
    the existing row). Not ``INSERT IGNORE``, which also stores a value too long for its column
    cut, nor a no-op ``ON DUPLICATE KEY UPDATE``, whose exclusive lock on the existing row
    deadlocked a rotation against writers holding it shared."""
    if not rows:
        return
    if conn.dialect.name in MYSQL:
        for row in rows:
            insert_if_absent(conn, table.insert().values(**row), {})
        return
    conn.execute(insert(conn.dialect.name, table).on_conflict_do_nothing(), list(rows))


def upsert(dialect: str, table: sa.Table, values: dict[str, Any] | None,
           keys: Sequence[sa.Column], set_: Callable[[Any], dict[str, Any]]) -> Any:
    """INSERT ``values``, or on a conflict over ``keys`` (the primary key on MySQL) SET
    ``set_(new)``, where ``new`` names the proposed row's columns. Expressions in ``set_``
    read the stored row: MySQL evaluates SET left to right, so a value that later columns
    read (e.g. ``last_activity``) must come LAST in the dict. ``values`` None: the rows
    are passed at execution (several at once)."""
    stmt = insert(dialect, table)
    if values is not None:
        stmt = stmt.values(**values)
    if dialect in MYSQL:
        return stmt.on_duplicate_key_update(list(set_(stmt.inserted).items()))
    return stmt.on_conflict_do_update(index_elements=list(keys), set_=set_(stmt.excluded))


def greatest(dialect: str, a: Any, b: Any) -> Any:
    return sa.func.max(a, b) if dialect == "sqlite" else sa.func.greatest(a, b)


def _key_of(table: sa.Table) -> list[sa.Column]:
    return list(table.primary_key.columns)


def _locked_keys(conn: Connection, table: sa.Table, where: Sequence[Any],
                 limit: int | None = None, skip_locked: bool = False
                 ) -> list[tuple[Any, ...]]:
    q = sa.select(*_key_of(table)).where(*where)
    if limit is not None:
        q = q.limit(limit)
    q = q.with_for_update(skip_locked=skip_locked)
    return [tuple(r) for r in conn.execute(q)]


def _by_keys(table: sa.Table, keys: Sequence[tuple[Any, ...]]) -> Any:
    cols = _key_of(table)
    if len(cols) == 1:
        return cols[0].in_([k[0] for k in keys])
    return sa.tuple_(*cols).in_(list(keys))


def update_returning(conn: Connection, table: sa.Table, where: Sequence[Any],
                     values: dict[str, Any], columns: Sequence[Any]) -> list[RowMapping]:
    """UPDATE the rows matching ``where``; returns ``columns`` of the updated rows."""
    if conn.dialect.update_returning:
        return list(conn.execute(table.update().where(*where).values(**values)
                                 .returning(*columns)).mappings())
    keys = _locked_keys(conn, table, where)
    if not keys:
        return []
    conn.execute(table.update().where(_by_keys(table, keys)).values(**values))
    return list(conn.execute(sa.select(*columns).where(_by_keys(table, keys))).mappings())


def delete_returning(conn: Connection, table: sa.Table, where: Sequence[Any],
                     columns: Sequence[Any]) -> list[RowMapping]:
    """DELETE the rows matching ``where``; returns ``columns`` of the deleted rows."""
    if conn.dialect.delete_returning:
        return list(conn.execute(table.delete().where(*where).returning(*columns)).mappings())
    keys = _locked_keys(conn, table, where)
    if not keys:
        return []
    found = list(conn.execute(sa.select(*columns).where(_by_keys(table, keys))).mappings())
    conn.execute(table.delete().where(_by_keys(table, keys)))
    return found


def claim_returning(conn: Connection, table: sa.Table, where: Sequence[Any], order: Any,
                    limit: int, values: dict[str, Any]) -> list[RowMapping]:
    """UPDATE up to ``limit`` rows matching ``where`` (in ``order``) that no other
    transaction holds locked; returns the updated rows. Concurrent claimers take disjoint
    sets (``SKIP LOCKED``; SQLite has one writer at a time)."""
    if conn.dialect.update_returning:   # one statement
        candidates = sa.select(*_key_of(table)).where(*where).order_by(order).limit(limit)
        if conn.dialect.name == "postgresql":
            candidates = candidates.with_for_update(skip_locked=True)
        return list(conn.execute(table.update().where(
            sa.tuple_(*_key_of(table)).in_(candidates)).values(**values)
            .returning(*table.c)).mappings())
    # MySQL: a locking read sorted by a filesort locks every row it examined, so the earliest
    # candidates are read first without locks (a window larger than the claim), then locked
    # by primary key with SKIP LOCKED: another pruner takes what this one does not hold
    window = [tuple(r) for r in conn.execute(sa.select(*_key_of(table)).where(*where)
                                             .order_by(order).limit(limit * 4))]
    if not window:
        return []
    keys = _locked_keys(conn, table, [_by_keys(table, window), *where], limit=limit,
                        skip_locked=True)
    if not keys:
        return []
    return update_returning(conn, table, [_by_keys(table, keys)], values, list(table.c))


def upsert_returning(conn: Connection, dialect: str, table: sa.Table, values: dict[str, Any],
                     keys: Sequence[sa.Column], set_: Callable[[Any], dict[str, Any]],
                     columns: Sequence[Any]) -> RowMapping:
    """:func:`upsert`, returning ``columns`` of the row as written. The row stays locked
    (PostgreSQL, MySQL) or the database write-locked (SQLite) until the commit."""
    stmt = upsert(dialect, table, values, keys, set_)
    if dialect not in MYSQL:
        return conn.execute(stmt.returning(*columns)).mappings().one()
    conn.execute(stmt)   # the insert or update holds the row lock until the commit
    return conn.execute(sa.select(*columns).where(
        *[c == values[c.name] for c in keys])).mappings().one()


def insert_if_absent(conn: Connection, stmt: Any, params: dict[str, Any]) -> bool:
    """Run the INSERT ``stmt`` built by :func:`absent_insert`; False when a row with its key
    exists (nothing changed). MySQL: a duplicate key fails only its statement, not the
    transaction, so the error is the answer."""
    if conn.dialect.name not in MYSQL:
        return conn.execute(stmt, params).first() is not None
    try:
        conn.execute(stmt, params)
    except sa.exc.IntegrityError as exc:
        if getattr(exc.orig, "args", (None,))[0] == _MYSQL_DUPLICATE_KEY:
            return False
        raise
    return True


_MYSQL_DUPLICATE_KEY = 1062


def absent_insert(dialect: str, table: sa.Table, values: dict[str, Any]) -> Any:
    """The INSERT of ``values`` for :func:`insert_if_absent`."""
    if dialect in MYSQL:
        return table.insert().values(**values)
    first = next(iter(table.primary_key.columns))
    return insert(dialect, table).values(**values).on_conflict_do_nothing().returning(first)


def changed_row(conn: Connection, stmt: Any, params: dict[str, Any] | None,
                columns: Sequence[Any], key: Sequence[Any]) -> Any:
    """Run the UPDATE ``stmt`` (at most one row: ``key`` is its WHERE by primary key, whose
    columns it leaves as they are); returns ``columns`` of the changed row, or None when it
    matched none."""
    if conn.dialect.update_returning:
        return conn.execute(stmt.returning(*columns), params or {}).first()
    if conn.execute(stmt, params or {}).rowcount != 1:
        return None
    return conn.execute(sa.select(*columns).where(*key), params or {}).first()
