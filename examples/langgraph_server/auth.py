"""LangGraph custom auth for the example: two users with fixed bearer tokens.

A real deployment verifies a JWT or asks its identity provider here.

The ``@auth.on`` handler is LangGraph's own owner filter for the server's records (threads,
runs, assistants, crons). It matters for more than bookkeeping: SecureSaver separates the
checkpoints of each user's tenant for every call that carries a user, but the server's worker
rolls runs back (``multitask_strategy="rollback"``, cancel with ``action="rollback"``) with no
user, so only this filter stops one user from cancelling -- and so deleting the in-flight turn
of -- another user's run (tests/test_server.py proves both). Keep an owner filter on runs and
threads. The ``owner`` field it writes stays in clear (encryption.py's ``clear_fields``): the
server compares it as stored.

Store items are separated by SecureStore (each user's namespaces live under their tenant), so
the store handler adds no filter (an ``owner`` filter would compare against the item values).

``seal_server_records()`` seals the record file of ``langgraph dev``'s in-memory runtime
(``.langgraph_api/.langgraph_ops.pckl``: thread state copies, run input) at rest with
SecureSaver's keys. It is called here because the server imports this module before it reads
that file (the checkpointer, store and encryption modules come later);
``SECURESAVER_SERVER_RECORDS=off`` turns it off. It does nothing on ``langgraph up`` or the
platform.
"""

from langgraph_sdk import Auth

from langgraph_securesaver.server.records import seal_server_records

seal_server_records()

USERS = {
    "token-alice": {"identity": "alice", "org_id": "acme"},
    "token-bob": {"identity": "bob", "org_id": "globex"},
}

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None) -> Auth.types.MinimalUserDict:
    scheme, _, token = (authorization or "").partition(" ")
    user = USERS.get(token) if scheme.lower() == "bearer" else None
    if user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail="unknown token")
    return {"identity": user["identity"], "org_id": user["org_id"]}


@auth.on
async def owner_only(ctx: Auth.types.AuthContext, value: dict) -> dict:
    """Tag what a user creates with their identity and show them only their own."""
    metadata = value.setdefault("metadata", {}) if isinstance(value, dict) else {}
    metadata["owner"] = ctx.user.identity
    return {"owner": ctx.user.identity}


@auth.on.store
async def store_by_tenant(ctx: Auth.types.AuthContext, value: dict) -> None:
    """SecureStore keeps each user's items under their own tenant: no filter on values."""
    return None
