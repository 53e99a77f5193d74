"""PII inventory and erasure: which tokenized values a tenant's threads hold, and erasing
them (the token stays in the conversation, the original leaves the vault): one value
(``forget_pii``) or every value of one person's identifiers (``forget_subject``, in
:mod:`.subjects`).

Knows the services of a saver (gate, vault, PII layer, registry); not the saver.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence

from ..audit import summaries
from ..errors import ConfigurationError
from ..gate import thread_id_of
from ..keys.crypto import TenantKeys
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
        erased += vault.forget_lookups(tenant, [
            lookup for known in ([kind] if kind else vault.kinds(tenant))
            for lookup in services.pii.lookups_of(keys, known, value)])
    summaries.mark_changed(services.registry, tenant)
    services.flush_deleted()
    services.registry.record_event("pii_forgotten", tenant=tenant, actor=requested_by,
                                   entity=kind, by_value=value is not None, erased=erased,
                                   erased_under=str(services.keyring.current_version))
    return erased


MAX_IDENTIFIERS = 1000  # identifiers of one subject per call (bounded work per request)


def identifier_list(identifiers: Iterable[str], *, allow_empty: bool) -> builtins.list[str]:
    """A person's identifiers (e-mails, phones, names, ids), checked: a list of 1 to
    MAX_IDENTIFIERS non-empty strings (0 allowed with a subject)."""
    if isinstance(identifiers, (str, bytes)):
        raise ConfigurationError("forget_subject(identifiers=...) takes a list of identifiers, "
                                 "not one string")
    values = list(dict.fromkeys(identifiers or ()))
    if (not values and not allow_empty) or len(values) > MAX_IDENTIFIERS or not all(
            isinstance(v, str) and v.strip() for v in values):
        raise ConfigurationError(
            f"forget_subject needs a subject, or 1 to {MAX_IDENTIFIERS} non-empty string "
            "identifiers")
    return values


def erase_identifiers(services: SaverServices, keys: TenantKeys,
                      values: Sequence[str]) -> tuple[int, int]:
    """Erase the vault values of ``values`` in ``keys``' tenant, in all its threads,
    companion records and store items (the tokens stay, unrelated to the value once its entry
    is gone). Returns (values erased, threads that held them).

    Each identifier is matched under every PII kind the tenant's vault holds, by the lookup
    HMAC of its normalized form. A write racing the erasure either committed its entry before
    (erased here) or after (a new entry with a new token: a new mention, which a later
    erasure removes); a token erased here never opens again."""
    vault = services.vault
    lookups = [lookup for kind in vault.kinds(keys.tenant) for v in values
               for lookup in services.pii.lookups_of(keys, kind, v)]
    return vault.erase_lookups(keys.tenant, lookups)
