"""At-rest encryption of LangGraph Server's own records with SecureSaver's keys.

LangGraph Server (``langgraph-api`` >= 0.6.22 with ``langgraph-sdk`` >= 0.3.1) keeps threads,
runs, assistants, crons and store items outside the checkpointer. An ``"encryption"`` entry in
``langgraph.json`` names a :class:`langgraph_sdk.Encryption` whose handlers the server calls on
every JSON field of those records (and on opaque blobs in deployments whose checkpointer is the
server's own). :func:`make_encryption` returns one backed by SecureSaver::

    "encryption": {"path": "langgraph_securesaver.server.encryption:encryption"}

What it does with a JSON field (the server requires that keys are kept: its JSON merges and
auth filters work key by key):

* every value is replaced by ``"ss1.<token>"``: AES-256-GCM with the tenant's data key (the
  keyring and registry of ``SECURESAVER_URL``, the checkpointer's), over the value's JSON
  after the redactor tokenized its PII (originals in the PII vault, restored for the tenant
  on read); the associated data binds (database id, tenant, key name), so a value moved to
  another key, tenant or database does not open;
* values of the keys in ``clear_fields`` (default ``owner``: the example's ``@auth.on``
  filter) and of the server's own bookkeeping keys (ids, ``graph_id``, the encryption marker
  -- the server never passes those to the handler) stay in clear; ``None`` stays ``None``;
* the tenant is ``tenant_of(user)`` of the authenticated user (the checkpointer's rule), set
  by the context handler for each request and stored by the server next to the values
  (``__encryption_context__``), so its worker and cron scheduler decrypt without a user.
  ``X-Encryption-Context`` headers are ignored: a client never chooses the key;
* decryption refuses (:class:`TamperedDataError`) a value that does not authenticate, or a
  plain value where a ciphertext belongs, and (:class:`AccessDenied`) a record of another
  tenant than the requesting user's.

Store items (model ``store``) are left to SecureStore when :func:`make_store` built the
process's store (their values are sealed there, with working ``filter=``); with another
store they are encrypted here like the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import AccessDenied, ConfigurationError, TamperedDataError, TenantRequired
from ..keys.crypto import TenantKeys
from ..keys.tokens import TEXT_PREFIX, associated_data, from_text, to_text, token_key_version
from ..saver import SecureSaver
from ..storage.backends import registry_url_for
from ..tenancy import validate_tenant
from .saver import ServerSettings, TenantOf, server_auth_user, tenant_from_field

logger = logging.getLogger(__name__)

#: where the tenant is kept in the encryption context the server stores with each record
CONTEXT_TENANT = "securesaver_tenant"
#: the server's marker key (added and stripped by the server, never by these handlers)
SERVER_MARKER = "__encryption_context__"
#: the PII vault owner under which originals of redacted server records are kept
VAULT_OWNER = "langgraph-server"

#: keys the server keeps in clear itself (langgraph_api.schema NEVER_ENCRYPT_FIELDS_GLOBAL and
#: the leaves of NEVER_ENCRYPT_PATHS, as of langgraph-api 0.16.7) and writes after encryption
#: (``graph_id`` in thread metadata): accepted in clear on decryption, never encrypted here
SERVER_CLEAR_KEYS: frozenset[str] = frozenset({
    "thread_id", "run_id", "assistant_id", "graph_id", "checkpoint_id", "task_id",
    "__pregel_checkpointer", "__pregel_resuming", "__pregel_durability", "__pregel_stream",
    "__pregel_task_id", "__pregel_checkpoint_ns", "__after_seconds__",
    "__request_start_time_ms__", "__encryption_context__", "__blob_encryption_context__",
    "langgraph_version", "langgraph_api_version", "langgraph_plan", "langgraph_host",
    "langgraph_api_url", "langgraph_request_id", "langgraph_auth_user_id",
    "langgraph_auth_permissions", "recursion_limit", "max_concurrency", "temporary", "ttl",
    "source", "step", "parents", "run_attempt", "counters_since_delta_snapshot",
})

_STORE_BY_SECURESTORE = threading.Event()


def mark_store_sealed() -> None:
    """Called by :func:`.store.make_store`: this process's server store is a
    SecureStore, which seals store values itself (the handlers then leave them)."""
    _STORE_BY_SECURESTORE.set()


def _server_clear_keys() -> frozenset[str]:
    """The installed server's own clear keys when it is loaded, else the list above."""
    try:
        from langgraph_api.schema import NEVER_ENCRYPT_FIELDS_GLOBAL, NEVER_ENCRYPT_PATHS
    except ImportError:
        return SERVER_CLEAR_KEYS
    leaves = {path.rsplit(".", 1)[-1] for path in NEVER_ENCRYPT_PATHS}
    return SERVER_CLEAR_KEYS | frozenset(NEVER_ENCRYPT_FIELDS_GLOBAL) | leaves


def _dumps(value: Any) -> bytes:
    """JSON as the server itself writes it (its serializer when loaded: UUIDs, datetimes)."""
    try:
        from langgraph_api.serde import json_dumpb
    except ImportError:
        return json.dumps(value, default=str, separators=(",", ":")).encode("utf-8")
    return bytes(json_dumpb(value))


class ServerEncryption:
    """SecureSaver-backed handlers for LangGraph Server's ``encryption`` entry.

    Args:
        tenant_of: user -> tenant id, as for the checkpointer (default: the user's
            ``identity``, or ``SECURESAVER_TENANT_FIELD``).
        settings: instead of reading ``SECURESAVER_*`` from the environment on first use.
        clear_fields: top-level keys whose values stay in clear in every record: the fields
            your ``@auth.on`` handlers filter on (the server compares them as stored).
        redaction: ``None`` to encrypt without tokenizing PII (default: the checkpointer's
            setting, ``SECURESAVER_REDACTION``).
        encrypt_store: encrypt store item values here even when SecureStore serves the store
            (default: only when it does not).
    """

    def __init__(self, *, tenant_of: TenantOf | None = None,
                 settings: ServerSettings | None = None,
                 clear_fields: Iterable[str] = ("owner",), redaction: Any = "env",
                 encrypt_store: bool | None = None) -> None:
        from langgraph_sdk import Encryption

        self._tenant_of = tenant_of
        self._settings = settings
        self.clear_fields = frozenset(clear_fields)
        self._redaction = redaction
        self._encrypt_store = encrypt_store
        self._saver: SecureSaver | None = None
        self._open_lock = threading.Lock()
        self._database_id: str | None = None
        self._accept_clear = self.clear_fields | _server_clear_keys()
        sdk = Encryption()
        sdk.context(self._context)
        sdk.encrypt.json(self._encrypt_json)
        sdk.decrypt.json(self._decrypt_json)
        sdk.encrypt.blob(self._encrypt_blob)
        sdk.decrypt.blob(self._decrypt_blob)
        #: the object langgraph.json's ``encryption.path`` names
        self.sdk = sdk

    def __repr__(self) -> str:
        return f"ServerEncryption(clear_fields={sorted(self.clear_fields)})"

    # the parts, opened on first use ------------------------------------------------------------
    def _settings_now(self) -> ServerSettings:
        if self._settings is None:
            self._settings = ServerSettings.from_env()
        return self._settings

    def tenant_of(self, user: Any) -> str | None:
        resolve = self._tenant_of or tenant_from_field(self._settings_now().tenant_field)
        tenant = resolve(user)
        return None if tenant is None else validate_tenant(tenant)

    def saver(self) -> SecureSaver:
        """The keys, registry, redactor and vault (a SecureSaver over the checkpointer's
        database that never stores a checkpoint), opened once."""
        with self._open_lock:
            if self._saver is None:
                from langgraph.checkpoint.memory import InMemorySaver
                cfg = self._settings_now()
                options: dict[str, Any] = {"default_tenant": cfg.default_tenant}
                if self._redaction == "env":
                    if not cfg.redaction:
                        options["redaction"] = None
                else:
                    options["redaction"] = self._redaction
                saver = SecureSaver(InMemorySaver(), keyring=cfg.keyring,
                                    registry=registry_url_for(cfg.url), **options)
                saver.registry.setup()
                saver.services.bind_keyring()
                self._database_id = saver.services.database_id()
                self._saver = saver
            return self._saver

    def close(self) -> None:
        """Release the registry's connections (the server never calls it; tests and tools)."""
        with self._open_lock:
            if self._saver is not None:
                self._saver.registry.dispose()
                self._saver = None

    def aad(self, tenant: str, key: str) -> bytes:
        """What a sealed JSON value is bound to: (database id, tenant, key name)."""
        return self._aad(tenant, key)

    async def _asaver(self) -> SecureSaver:
        if self._saver is not None:
            return self._saver
        return await asyncio.to_thread(self.saver)

    # tenants ------------------------------------------------------------------------------------
    async def _context(self, user: Any, ctx: Any) -> dict[str, Any]:
        """Per request, after auth: the tenant of the authenticated user (nothing the client
        sent in ``X-Encryption-Context`` is kept)."""
        tenant = self.tenant_of(user)
        return {} if tenant is None else {CONTEXT_TENANT: tenant}

    def _user_tenant(self) -> tuple[bool, str | None]:
        """(whether a server user is acting, the tenant it maps to -- or the default)."""
        user = server_auth_user()
        if user is None:
            return False, None
        return True, self.tenant_of(user) or self._settings_now().default_tenant

    def _encrypting_tenant(self, ctx: Any) -> str:
        stored = (getattr(ctx, "metadata", None) or {}).get(CONTEXT_TENANT)
        acting, user = self._user_tenant()
        if acting and user is None:
            raise TenantRequired("encrypting a LangGraph Server record for a user with no "
                                 "tenant (and no SECURESAVER_DEFAULT_TENANT)")
        if stored is not None and acting and stored != user:
            raise AccessDenied(
                f"encryption context names tenant {stored!r} but the request's user is "
                f"{user!r}; refusing to encrypt")
        tenant = stored or user or self._settings_now().default_tenant
        if tenant is None:
            raise TenantRequired("encrypting a LangGraph Server record (no authenticated "
                                 "user and no SECURESAVER_DEFAULT_TENANT)")
        tenant = validate_tenant(tenant)
        if stored != tenant and ctx is not None:
            # the server stores ctx.metadata next to the values: decryption needs the tenant
            ctx.metadata = {**(ctx.metadata or {}), CONTEXT_TENANT: tenant}
        return tenant

    def _decrypting_tenant(self, ctx: Any) -> str:
        stored = (getattr(ctx, "metadata", None) or {}).get(CONTEXT_TENANT)
        if stored is None:
            stored = self._settings_now().default_tenant
        if not isinstance(stored, str) or not stored:
            raise TamperedDataError(
                "an encrypted LangGraph Server record names no tenant in its encryption "
                "context (altered, or written without one)")
        tenant = validate_tenant(stored)
        acting, user = self._user_tenant()
        if acting and user != tenant:
            raise AccessDenied(
                f"a LangGraph Server record of tenant {tenant!r} was read by a user of tenant "
                f"{user!r}; refusing to decrypt it")
        return tenant

    # JSON ---------------------------------------------------------------------------------------
    def _aad(self, tenant: str, key: str) -> bytes:
        return associated_data("langgraph-server-json", self._database_id or "", tenant, key)

    def _passes_store(self, ctx: Any) -> bool:
        if getattr(ctx, "model", None) != "store":
            return False
        if self._encrypt_store is not None:
            return not self._encrypt_store
        return _STORE_BY_SECURESTORE.is_set()

    async def _encrypt_json(self, ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
        if not data or self._passes_store(ctx):
            return data
        tenant = self._encrypting_tenant(ctx)
        saver = await self._asaver()
        keys = await saver.services.atenant_keys(tenant)
        todo = {k: v for k, v in data.items()
                if v is not None and k not in self.clear_fields}
        if not todo:
            return data
        if saver.redactor is not None:
            return await asyncio.to_thread(self._seal_fields, saver, keys, data, todo, True)
        return self._seal_fields(saver, keys, data, todo, False)

    def _seal_fields(self, saver: SecureSaver, keys: TenantKeys, data: Mapping[str, Any],
                     todo: Mapping[str, Any], redact: bool) -> dict[str, Any]:
        out = dict(data)
        pii = saver.services.pii
        for key, value in todo.items():
            if redact:
                value = pii.redact_for_store(keys, VAULT_OWNER, value, key)
            out[key] = to_text(keys.seal(_dumps(value), self._aad(keys.tenant, key)))
        return out

    async def _decrypt_json(self, ctx: Any, data: dict[str, Any]) -> Any:
        if not data:
            return data
        sealed = {k: v for k, v in data.items() if isinstance(v, str) and
                  v.startswith(TEXT_PREFIX) and k not in self.clear_fields}
        for key, value in data.items():
            if key in sealed or value is None or key in self._accept_clear:
                continue
            if isinstance(value, Mapping) and SERVER_MARKER in value:
                continue    # a nested field the server encrypted on its own (run kwargs)
            if self._passes_store(ctx):
                continue
            raise TamperedDataError(
                f"a plain value was found in the encrypted LangGraph Server field {key!r}; "
                "refusing to load it (it was written without encryption, or injected)")
        if not sealed:
            return data
        tenant = self._decrypting_tenant(ctx)
        saver = await self._asaver()
        keys = await saver.services.arequire_keys(tenant)
        opened: dict[str, Any] = {}
        stale = False
        for key, text in sealed.items():
            token = from_text(text)
            stale = stale or token_key_version(token) != keys.current_version
            opened[key] = json.loads(keys.open(token, self._aad(tenant, key)))
        plain = {**data, **opened}
        redactor = saver.redactor
        if redactor is not None and redactor.find_tokens(opened):
            restored = await asyncio.to_thread(saver.services.pii.restore_for_store, keys,
                                               opened)
            plain = {**data, **restored}
        if not stale:
            return plain
        # sealed under an older data key (rotated): the server stores the replacement
        # (DecryptResult: in langgraph-sdk 0.4.14, the version tested)
        from langgraph_sdk.encryption.types import DecryptResult
        fresh = {**data, **{k: to_text(keys.seal(_dumps(v), self._aad(tenant, k)))
                            for k, v in opened.items()}}
        return DecryptResult(plain, fresh)

    # blobs ---------------------------------------------------------------------------------------
    def _blob_aad(self, tenant: str) -> bytes:
        return associated_data("langgraph-server-blob", self._database_id or "", tenant)

    async def _encrypt_blob(self, ctx: Any, blob: bytes) -> bytes:
        tenant = self._encrypting_tenant(ctx)
        saver = await self._asaver()
        keys = await saver.services.atenant_keys(tenant)
        return keys.seal(bytes(blob), self._blob_aad(tenant))

    async def _decrypt_blob(self, ctx: Any, blob: bytes) -> bytes:
        tenant = self._decrypting_tenant(ctx)
        saver = await self._asaver()
        keys = await saver.services.arequire_keys(tenant)
        return keys.open(bytes(blob), self._blob_aad(tenant))


def make_server_encryption(**options: Any) -> ServerEncryption:
    """A :class:`ServerEncryption` (its ``.sdk`` is the server's ``Encryption`` object)."""
    return ServerEncryption(**options)


def make_encryption(*, tenant_of: TenantOf | None = None,
                    settings: ServerSettings | None = None,
                    clear_fields: Iterable[str] = ("owner",), redaction: Any = "env",
                    encrypt_store: bool | None = None) -> Any:
    """The ``langgraph_sdk.Encryption`` for langgraph.json's ``encryption`` entry (see the
    module docstring; options as :class:`ServerEncryption`)."""
    if isinstance(clear_fields, str):
        raise ConfigurationError("clear_fields is a collection of key names, not one string")
    return ServerEncryption(tenant_of=tenant_of, settings=settings, clear_fields=clear_fields,
                            redaction=redaction, encrypt_store=encrypt_store).sdk


def _default() -> Any:
    try:
        return make_encryption()
    except ImportError:   # langgraph-sdk missing: the server is not installed either
        return None


encryption = _default()
"""The defaults: ``"path": "langgraph_securesaver.server.encryption:encryption"``."""
