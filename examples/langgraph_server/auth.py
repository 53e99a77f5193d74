"""LangGraph custom auth for the example: two users with fixed bearer tokens.

A real deployment verifies a JWT or asks its identity provider here. The ``@auth.on`` handler
is LangGraph's own owner filter for thread and run records (the server's bookkeeping); the
checkpoints themselves are separated by SecureSaver whatever these filters say.
"""

from langgraph_sdk import Auth

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
