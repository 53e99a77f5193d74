"""PII inventory and erasure: which tokenized values a tenant's threads hold, and erasing
them (the token stays in the conversation, the original leaves the vault): one value
(``forget_pii``) or every value of one person across tenants (``forget_subject``).

Knows the services of a saver (gate, vault, PII layer, registry); not the saver.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable

from .. import summaries
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
    erased = vault.forget_tokens(tenant, tokens) if tokens else 0
    if value is not None:   # the value's entry found by its lookup HMAC (kept in the row only)
        token_key = PiiLayer.token_key(keys)
        erased += vault.forget_lookups(tenant, [
            make_token(token_key, known, value) for known in ([kind] if kind else
                                                              vault.kinds(tenant))])
    summaries.mark_changed(services.registry, tenant)
    services.flush_deleted()
    services.registry.record_event("pii_forgotten", tenant=tenant, actor=requested_by,
                                   entity=kind, by_value=value is not None, erased=erased,
                                   erased_under=str(services.keyring.current_version))
    return erased


MAX_IDENTIFIERS = 1000  # identifiers of one subject per call (bounded work per request)


def forget_subject(services: SaverServices, identifiers: Iterable[str], *,
                   tenants: Iterable[str] | None = None,
                   requested_by: str | None = None) -> dict[str, int]:
    """Erase every stored value of one person, given by ``identifiers`` (their e-mails,
    phone numbers, names, ids: any form the redactor normalizes), in ``tenants`` (None: every
    tenant the caller may act for), in all their threads, companion records and store items.
    One deletion receipt (counts, never values). Returns {tenant: values erased}.

    Each identifier is matched under every PII kind the tenant's vault holds, by the lookup
    HMAC of its normalized form; the tokens stay in the conversations, unrelated to the value
    once its entry is gone. A write racing the erasure either committed its entry before
    (erased here) or after (a new entry with a new token: a new mention, which a later
    erasure removes); a token erased here never opens again."""
    from ..redaction import make_token
    requested_by = validate_actor(requested_by)
    if isinstance(identifiers, (str, bytes)):
        raise ConfigurationError("forget_subject takes a list of identifiers, not one string")
    values = list(dict.fromkeys(identifiers))
    if not values or len(values) > MAX_IDENTIFIERS or not all(
            isinstance(v, str) and v.strip() for v in values):
        raise ConfigurationError(
            f"forget_subject needs 1 to {MAX_IDENTIFIERS} non-empty string identifiers")
    gate, vault = services.gate, services.vault
    if tenants is None:
        scoped = gate.admin_tenant("forget_subject", None)
        names = [scoped] if scoped is not None else vault.tenants()
    else:
        if isinstance(tenants, (str, bytes)):
            raise ConfigurationError("forget_subject(tenants=...) takes a list of tenant ids")
        names = sorted({gate.admin_tenant("forget_subject", validate_tenant(t)) or t
                        for t in tenants})
    by_tenant: dict[str, int] = {}
    threads: dict[str, int] = {}
    for tenant in names:
        keys = services.keys.keys_for(tenant, create=False)
        if keys is None:
            by_tenant[tenant] = threads[tenant] = 0
            continue
        token_key = PiiLayer.token_key(keys)
        lookups = [make_token(token_key, kind, v) for kind in vault.kinds(tenant)
                   for v in values]
        by_tenant[tenant], threads[tenant] = vault.erase_lookups(tenant, lookups)
    services.flush_deleted()
    erased_under = str(services.keyring.current_version)
    services.registry.add_receipt(
        tenant=names[0] if len(names) == 1 else "", thread_id=None, action="forgotten",
        reason="forget_subject", requested_by=requested_by,
        detail={"identifiers": len(values), "tenants": len(names),
                "values_erased": by_tenant, "threads": threads, "erased_under": erased_under})
    for tenant in names:
        services.registry.record_event(
            "subject_forgotten", tenant=tenant, actor=requested_by, erased=by_tenant[tenant],
            threads=threads[tenant], erased_under=erased_under)
    return by_tenant
