"""The redactor: detection, replacement, tokens and caching (its read half, restore, is
:mod:`.restoring`)."""

from __future__ import annotations

import hashlib
import json
import logging
import marshal
import operator
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from presidio_analyzer import AnalyzerEngine

from ..errors import ConfigurationError
from ..keys.material import SecretBytes
from .batching import BatchedAnalysis
from .budget import Spend
from .caches import Cache, Cached, IdentityCache, vault_size
from .engine import (
    DEFAULT_PHONE_REGIONS,
    LANGUAGE,
    PATTERN_ENTITIES,
    empty_artifacts,
    freeze_long_lived_heap,
    ner_entities_of,
    shared_analyzer,
)
from .errors import RedactionError
from .numbers import NumberRedaction
from .policy import RedactionPolicy
from .readback import ReadBack
from .restoring import Restoration
from .snapshots import equal_prefix, fields_of, snapshot
from .tokens import (
    kind_label,
)
from .types import Entity, RedactionResult, RedactionStats, VaultEntry
from .view import (
    OWN_LABELS,
    dump_like,
    looks_like_json,
    may_have_pii,
)
from .walker import Walker

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Per-call state
# --------------------------------------------------------------------------------------------
class _Call:
    """State of one call: context, policy, key, collected vault entries and counters."""

    __slots__ = ("analyzed", "chars", "ctx", "found", "free", "hits", "key", "policy", "scopes",
                 "seen", "spend", "unbilled")

    def __init__(self, ctx: bytes, key: SecretBytes, policy: RedactionPolicy,
                 spend: Spend) -> None:
        self.spend = spend  # the budget of the write this call belongs to
        self.ctx = ctx
        self.key = key
        self.policy = policy
        self.scopes: list[dict[str, VaultEntry]] = [{}]
        self.seen = 0
        self.hits = 0
        self.analyzed = 0
        self.chars = 0
        self.found: list[Entity] = []
        self.free: dict[int, str] | None = None  # strings read back (see .readback), by id
        self.unbilled = 0  # > 0 while redacting one of them: analysis not charged

    def add(self, entries: Sequence[VaultEntry]) -> None:
        top = self.scopes[-1]
        for e in entries:
            if e.token not in top:
                top[e.token] = e

    def push(self) -> None:
        self.scopes.append({})

    def pop(self) -> tuple[VaultEntry, ...]:
        entries = tuple(self.scopes.pop().values())
        self.add(entries)
        return entries


# --------------------------------------------------------------------------------------------
# Redactor
# --------------------------------------------------------------------------------------------
class Redactor(BatchedAnalysis, NumberRedaction, Restoration):
    """Finds personal data and secrets in LangGraph state and replaces them per a policy.

    One instance can be shared by threads; the presidio engine is built lazily on first use
    and shared by every default redactor of the process.

    Args:
        policy: what to do per entity kind and channel (``RedactionPolicy.default()``).
        analyzer: a presidio ``AnalyzerEngine`` to use instead of the default offline engine,
            e.g. ``build_analyzer(nlp_engine=spacy_ner_engine("en_core_web_lg"))`` for NER.
            Custom analyzers are used as given (no pre-filter is applied).
        phone_regions: regions whose phone-number formats are recognized (default engine).
        cache_size: entries in each of the five result caches (0 disables caching).
        cache_max_chars: approximate bound on the characters (marshal bytes for messages)
            each cache holds; the caches hold original values in memory until evicted.
        freeze_heap: once the engine is built, move the process's long-lived objects out of
            the cyclic garbage collector (``gc.freeze()``, once per process; see
            :func:`~langgraph_securesaver.redaction.engine.freeze_long_lived_heap`), so that a
            full collection triggered inside a redaction worker thread does not hold the GIL
            (and stall an async caller's event loop) for a walk of the whole engine heap.
            Pass ``False`` if your application manages ``gc.freeze()`` itself.
    """

    def __init__(self, policy: RedactionPolicy | None = None, *,
                 analyzer: AnalyzerEngine | None = None,
                 phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS,
                 cache_size: int = 16_384,
                 cache_max_chars: int = 4_000_000,
                 freeze_heap: bool = True) -> None:
        if policy is not None and not isinstance(policy, RedactionPolicy):
            raise ConfigurationError("policy must be a RedactionPolicy")
        self.policy = policy or RedactionPolicy.default()
        self._phone_regions = tuple(phone_regions)
        self._analyzer = analyzer
        self._custom_analyzer = analyzer is not None
        self._freeze_heap = bool(freeze_heap)
        self._setup_lock = threading.Lock()
        self._pattern_entities: tuple[str, ...] | None = None
        self._ner_entities: tuple[str, ...] = ()
        self._prefilter = False
        self._artifacts: Any = None
        # string -> result, keyed by (context, string); redaction outputs map to themselves
        self._text_cache = Cache(cache_size, cache_max_chars)
        # message content -> redacted message, keyed by (context, class, marshal of fields)
        self._message_cache = Cache(cache_size, cache_max_chars)
        # the same message object seen again (fields compared by identity first)
        self._identity_cache = IdentityCache(cache_size, cache_max_chars)
        # stored message (+ the originals of its tokens) -> marshal dump of the restored one
        self._restore_cache = Cache(cache_size, cache_max_chars)
        # per conversation: the last list of messages and its results (prefix reuse)
        self._list_cache = Cache(max(cache_size // 16, 1) if cache_size > 0 else 0,
                                 cache_max_chars)
        # message objects handed out by reads: their content was paid for when stored
        self._readback = ReadBack(cache_size > 0)
        self._stats = RedactionStats()
        self._process_key = SecretBytes(secrets.token_bytes(32))
        self._known_labels: frozenset[str] | None = None
        # the clock the time budget is measured with (tests replace it)
        self._clock: Callable[[], float] = time.monotonic

    # -- engine ------------------------------------------------------------------------------
    @property
    def analyzer(self) -> AnalyzerEngine:
        self._ensure_engine()
        if self._analyzer is None:  # pragma: no cover - _ensure_engine always sets it
            raise RedactionError("the presidio analyzer could not be built")
        return self._analyzer

    def _ensure_engine(self) -> None:
        if self._pattern_entities is not None:
            return
        with self._setup_lock:
            if self._pattern_entities is not None:
                return
            analyzer = self._analyzer or shared_analyzer(self._phone_regions)
            ner = ner_entities_of(analyzer, LANGUAGE)
            supported = set(analyzer.get_supported_entities(LANGUAGE))
            self._artifacts = empty_artifacts(LANGUAGE)
            self._ner_entities = tuple(sorted(ner))
            self._analyzer = analyzer
            self._pattern_entities = tuple(sorted(supported - ner))
            kinds = set(supported) | set(self.policy.actions) | OWN_LABELS
            for sub in self.policy.channels.values():
                if sub is not None:
                    kinds |= set(sub.actions)
            self._known_labels = frozenset(kind_label(k) for k in kinds)
            # the pre-filter knows the built-in recognizers only
            self._prefilter = set(self._pattern_entities) <= set(PATTERN_ENTITIES)
            logger.debug("redactor ready: %d pattern entities, NER entities %s",
                         len(self._pattern_entities), list(self._ner_entities))
        if self._freeze_heap:
            freeze_long_lived_heap()

    @property
    def stats(self) -> RedactionStats:
        return self._stats

    def clear_cache(self) -> None:
        """Forget cached results (they hold original values in memory until evicted)."""
        self._text_cache.clear()
        self._message_cache.clear()
        self._identity_cache.clear()
        self._list_cache.clear()
        self._restore_cache.clear()
        self._readback.clear()

    # -- public API --------------------------------------------------------------------------
    def redact(self, text: str, *, token_key: bytes | SecretBytes | None = None,
               channel: str | None = None) -> RedactionResult:
        """Redact one string as plain text (no JSON parsing); for trying a policy out.

        Without ``token_key`` tokens use a random key made once per ``Redactor``: they are
        stable within the process and meaningless outside it. A ``SecretBytes`` key is never
        held raw in a frame of the redactor (docs/concepts/keys.md)."""
        if not isinstance(text, str):
            raise TypeError(f"redact() takes a str, not {type(text).__name__}")
        policy = self.policy.for_channel(channel)
        if policy is None:
            return RedactionResult(text, [], [])
        call = self._new_call(policy, self._check_key(token_key))
        try:
            entry = self._redact_plain(text, call)
        finally:
            self._flush(call)
        return RedactionResult(entry.text, list(entry.entities), list(entry.vault))

    def redact_value(self, value: Any, *, channel: str | None,
                     token_key: bytes | SecretBytes) -> tuple[Any, list[VaultEntry]]:
        """A redacted copy of ``value`` (LangGraph state) and the vault entries of its tokens.

        ``value`` itself is never mutated; unchanged sub-objects are shared with it, and a
        message seen before may come back as the same redacted object as last time: treat the
        result as read-only. Strings holding a JSON object or array are parsed, redacted value
        by value and re-serialized (only when something changed). Raises ``RedactionError``
        (and returns nothing) for values it cannot redact safely.
        """
        policy = self.policy.for_channel(channel)
        if policy is None:
            return value, []
        call = self._new_call(policy, self._check_key(token_key, required=True))
        walker = self._walker(call)
        walker.name = channel  # a state channel is named like a key ({"phone": 4155550142})
        try:
            result = walker.walk(value)
        finally:
            self._flush(call)
        return result, list(call.scopes[0].values())

    def remember_read(self, value: Any, *, channel: str | None,
                      token_key: bytes | SecretBytes) -> None:
        """``value`` was just read back for the tenant of ``token_key``: analysis of its
        messages' strings, stored and paid for before, is not charged to a later write."""
        policy = self.policy.for_channel(channel)
        if policy is not None:
            key = self._check_key(token_key, required=True)
            self._readback.remember(self._new_call(policy, key).ctx, value)

    # -- internals ---------------------------------------------------------------------------
    def _check_key(self, token_key: bytes | SecretBytes | None,
                   required: bool = False) -> SecretBytes:
        if token_key is None:
            if required:
                raise ConfigurationError("redact_value needs a token_key (bytes)")
            return self._process_key
        if not isinstance(token_key, (bytes, bytearray, SecretBytes)) or len(token_key) < 16:
            raise ConfigurationError("token_key must be at least 16 bytes")
        return token_key if isinstance(token_key, SecretBytes) else SecretBytes(token_key)

    def _new_call(self, policy: RedactionPolicy, key: SecretBytes) -> _Call:
        ctx = hashlib.blake2b(key.reveal(), digest_size=16, person=b"ss-redact-ctx").digest()
        ctx += policy.fingerprint.encode("ascii")
        return _Call(ctx, key, policy, self.new_spend())

    def _flush(self, call: _Call) -> None:
        self._stats.record(seen=call.seen, hits=call.hits, analyzed=call.analyzed,
                           chars=call.chars, entities=call.found)

    def _walker(self, call: _Call) -> Walker:
        walker: Walker

        def on_str(s: str, depth: int, is_key: bool) -> str:
            free = call.free is not None and call.free.get(id(s)) is s
            call.unbilled += free
            try:
                if not is_key and looks_like_json(s):
                    return self._redact_json(s, call, depth)
                return self._redact_str_named(s, None if is_key else walker.name, call)
            finally:
                call.unbilled -= free

        def on_message(msg: Any, depth: int) -> Any:
            return self._redact_message(msg, call, walker, depth)[0]

        def on_message_list(messages: list[Any], depth: int) -> list[Any]:
            return self._redact_message_list(messages, call, walker, depth)

        def on_str_list(strings: Sequence[str], depth: int) -> Sequence[str]:
            return self._redact_str_list(strings, depth, on_str, call)

        walker = Walker(on_str, max_depth=call.policy.max_depth, on_message=on_message,
                        on_message_list=on_message_list,
                        on_number=lambda n, name: self._redact_number(n, name, call),
                        on_str_list=on_str_list)
        return walker

    def _redact_message_list(self, messages: list[Any], call: _Call, walker: Walker,
                             depth: int) -> list[Any]:
        """A list of messages (the ``messages`` channel): reuse the previous call's results
        for the longest prefix of messages whose fields equal a snapshot taken then
        (:mod:`.snapshots`: a message replaced, edited in place, even deep inside a dict, or
        given an id since the last call is redone); only what changed, and the new suffix,
        go through the per-message path.
        """
        live = fields_of(messages)
        if live is None:  # a message class without __dict__: no list-level reuse
            return [self._redact_message(m, call, walker, depth + 1)[0] for m in messages]
        fields, extras = live
        first = messages[0]
        head = next(iter(fields[0].values()), None)
        thread_key = (call.ctx, type(first), getattr(first, "id", None),
                      head if type(head) is str else None)
        state = self._list_cache.get(thread_key)
        prefix = 0 if state is None else equal_prefix(fields, extras, state[0], state[1])
        snaps: list[Any] = list(state[0][:prefix]) if state is not None else []
        snap_extras: list[Any] = list(state[1][:prefix]) if state is not None else []
        results: list[Any] = list(state[2][:prefix]) if state is not None else []
        cacheable = True
        call.push()
        try:
            if state is not None and prefix:
                call.add(state[3] if prefix == len(state[0]) else
                         tuple(e for v in state[4][:prefix] for e in v))
                call.hits += prefix
            vaults: list[tuple[VaultEntry, ...]] = list(state[4][:prefix]) if state else []
            for m, f in zip(messages[prefix:], fields[prefix:], strict=True):
                result, copied, vault = self._redact_message(m, call, walker, depth + 1)
                results.append(result)
                vaults.append(vault)
                if copied is None:
                    cacheable = False
                elif cacheable:
                    snaps.append(snapshot(f, copied[0]))
                    snap_extras.append(copied[1])
        finally:
            union = call.pop()
        # a one-message list (a turn's input, a node's write) has no prefix to reuse: caching
        # it would only evict conversations (its message is in the per-message caches)
        if cacheable and len(messages) > 1:  # results shared with the per-message caches
            self._list_cache.put(thread_key, (snaps, snap_extras, results, union, vaults),
                                 64 * len(messages))
        if all(map(operator.is_, results, messages)):
            return messages
        return results

    def _redact_message(self, msg: Any, call: _Call, walker: Walker,
                        depth: int) -> tuple[Any, Any, tuple[VaultEntry, ...]]:
        """One LangChain message -> (redacted message, snapshot of its fields or None, vault).

        Reuses the result for the same object whose fields still equal the snapshot taken
        last time, or for any message whose fields marshal to the same bytes (e.g. the same
        message reloaded from a checkpoint). The snapshot is a marshal round-trip copy, so
        comparing with it also catches edits made in place inside dicts and lists.
        """
        fields = getattr(msg, "__dict__", None)
        if not isinstance(fields, dict):
            return walker.walk_message_guarded(msg, depth), None, ()
        values = (tuple(fields.values()), getattr(msg, "__pydantic_extra__", None))
        known = self._identity_cache.get(msg)
        if known is not None and known[2] == call.ctx and known[3] == values:
            call.hits += 1
            if known[5]:
                call.add(known[5])
            return known[4], known[3], known[5]
        try:
            dumped: bytes | None = marshal.dumps(values, 0)
        except ValueError:  # a field holds an object marshal cannot encode: no caching
            dumped = None
        content_key = (call.ctx, type(msg), dumped)
        hit = self._message_cache.get(content_key) if dumped is not None else None
        vault: tuple[VaultEntry, ...]
        if hit is not None:
            result, vault = hit
            call.hits += 1
            call.add(vault)
        else:
            call.push()
            outer = call.free
            call.free = self._readback.exempt(call.ctx, msg) or outer
            try:
                content = fields.get("content")
                if call.free is None and type(content) is list and len(content) > 1:
                    self._prefetch(content, call, depth)  # its parts, in a few batches
                result = walker.walk_message_guarded(msg, depth)
            finally:
                call.free = outer
                vault = call.pop()
            if dumped is not None:
                self._message_cache.put(content_key, (result, vault),
                                        len(dumped) + vault_size(vault) + 256)
        if dumped is None:
            return result, None, vault
        snapshot = marshal.loads(dumped)  # noqa: S302 - bytes we dumped ourselves
        self._identity_cache.put(msg, len(dumped) + 256, call.ctx, snapshot, result, vault)
        return result, snapshot, vault

    def _redact_json(self, s: str, call: _Call, depth: int) -> str:
        key = (call.ctx + b"/json", s)
        hit: Cached | None = self._text_cache.get(key)
        if hit is not None:
            call.seen += 1
            call.hits += 1
            call.add(hit.vault)
            return hit.text
        try:
            parsed = json.loads(s)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, (dict, list)):
            entry = self._redact_plain(s, call)
            call.add(entry.vault)
            return entry.text
        self._prefetch(parsed, call, depth)
        call.push()
        try:
            walked = self._walker(call).walk(parsed, depth)
        finally:
            vault = call.pop()
        out = s if walked is parsed else dump_like(s, walked)
        self._text_cache.put(key, Cached(out, vault, ()), 2 * len(s) + vault_size(vault))
        if out is not s:
            self._text_cache.put((call.ctx + b"/json", out), Cached(out, (), ()), len(out))
        return out

    def _redact_plain(self, s: str, call: _Call) -> Cached:
        call.seen += 1
        if not s:
            return Cached(s, (), ())
        key = (call.ctx, s)
        hit: Cached | None = self._text_cache.get(key)
        if hit is not None:
            call.hits += 1
            return hit
        if not self._custom_analyzer and not may_have_pii(s):
            return Cached(s, (), ())
        found = self._budgeted_detect(s, call.policy, call.spend, call.unbilled > 0)
        return self._store_plain(s, self._finish(s, found, call.policy), call)

    def _store_plain(self, s: str, entities: list[Entity], call: _Call) -> Cached:
        out, vault = self._apply(s, entities, call.policy, call.key)
        entry = Cached(out, tuple(vault), tuple(entities))
        call.analyzed += 1
        call.chars += len(s)
        call.found.extend(entities)
        self._text_cache.put((call.ctx, s), entry, 2 * len(s) + vault_size(vault) + 64)
        if out != s:  # a redaction output is done: never analyze it again
            self._text_cache.put((call.ctx, out), Cached(out, (), ()), len(out) + 64)
        return entry

