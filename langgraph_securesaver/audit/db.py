"""The audit's and the trail's view of a database opened by URL: the registry's engine alone.

Kept apart from the grouped statements (:mod:`.sql`) so that a command that only reads
the trail (``securesaver events``) imports neither them nor the cipher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..registry.core import Registry


class AuditDatabase:
    """The audit's and the trail's view of a database opened by URL, where the registry and
    the inner saver's tables live together (what the CLI opens): the registry's engine only.
    No inner saver, no keyring, no LangGraph import -- the grouped statements need none.
    Operator access: it refuses to run inside a tenant scope (use a SecureSaver there)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def admin_tenant(self, operation: str, tenant: Any = None) -> str | None:
        """The scope rule of an AuditDatabase: operator only (refused inside a tenant scope)."""
        from ..errors import AccessDenied
        from ..tenancy import current_tenant_scope, validate_tenant
        if current_tenant_scope() is not None:
            raise AccessDenied(f"{operation} on an AuditDatabase is operator access; inside a "
                               "tenant scope use the SecureSaver's own methods")
        return None if tenant is None else validate_tenant(tenant)

    @staticmethod
    def inner_tables(dialect: str) -> tuple[str, ...]:
        """The inner saver's tables the grouped statements read."""
        if dialect in ("postgresql", "mysql", "mariadb"):   # LangGraph's savers' table names
            return ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
        return ("checkpoints", "writes")

    def has_inner_tables(self) -> bool:
        import sqlalchemy as sa
        inspector = sa.inspect(self.registry.engine)
        return all(inspector.has_table(name)
                   for name in self.inner_tables(self.registry.dialect))
