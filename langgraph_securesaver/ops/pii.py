"""PII inventory and erasure: which tokenized values a tenant's threads hold, and erasing
them (the token stays in the conversation, the original leaves the vault).

Knows the services of a saver (gate, vault, PII layer, registry); not the saver.
"""

from __future__ import annotations

import builtins

from ..errors import ConfigurationError
from ..gate import thread_id_of
from ..pii_layer import PiiLayer
from ..services import SaverServices
from ..tenancy import validate_actor, validate_tenant


def pii_inventory(services: SaverServices, tenant: str | None = None,
                  thread_id: str | None = None) -> dict[tuple[str, str], dict[str, int]]:
    tenant = services.gate.admin_tenant("pii_inventory", tenant)
    if thread_id is not None:
        thread_id = thread_id_of(thread_id)
    return services.vault.inventory(tenant, thread_id)


def forget_pii(services: SaverServices, tenant: str, value: str | None = None, *,
               kind: str | None = None, requested_by: str | None = None) -> int:
    from ..redaction import make_token
    tenant = services.gate.admin_tenant("forget_pii", validate_tenant(tenant)) or tenant
    requested_by = validate_actor(requested_by)
    if value is None and kind is None:
        raise ConfigurationError("forget_pii needs a value or a kind")
    keys = services.keys.keys_for(tenant, create=False)
    if keys is None:
        return 0
    vault = services.vault
    tokens: builtins.list[str] = []
    if kind is not None:
        tokens += vault.tokens_of_kind(tenant, kind)
    if value is not None:
        token_key = PiiLayer.token_key(keys)
        for known in ([kind] if kind else vault.kinds(tenant)):
            tokens.append(make_token(token_key, known, value))
    erased = vault.forget_tokens(tenant, tokens)
    services.flush_deleted()
    services.registry.record_event("pii_forgotten", tenant=tenant, actor=requested_by,
                                   entity=kind, by_value=value is not None, erased=erased,
                                   erased_under=str(services.keyring.current_version))
    return erased
