"""The redactor: detection, replacement, tokens, caching and restore."""

from __future__ import annotations

import bisect
import copy
import hashlib
import hmac
import ipaddress
import json
import logging
import marshal
import operator
import re
import secrets
import threading
import time
import unicodedata
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from presidio_analyzer import AnalyzerEngine, RecognizerResult

from ..errors import ConfigurationError
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
from .policy import Action, RedactionPolicy
from .recognizers import API_SECRET, CANDIDATE_RE, label_veto, private_key_spans
from .walker import Walker

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    """One detected value: its kind, its span in the analyzed text, the score and the text."""

    kind: str
    start: int
    end: int
    score: float
    text: str


@dataclass(frozen=True)
class VaultEntry:
    """The original value behind a ``TOKENIZE`` replacement (what the saver encrypts)."""

    token: str
    kind: str
    value: str


@dataclass(frozen=True)
class RedactionResult:
    """The redacted text, every detection that survived filtering (including ``KEEP`` ones),
    and the vault entries for the tokens in ``text``."""

    text: str
    entities: list[Entity]
    vault: list[VaultEntry] = field(default_factory=list)


class RedactionStats:
    """Thread-safe counters for one :class:`Redactor` (read them, or ``reset()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset_unlocked()

    def _reset_unlocked(self) -> None:
        self.chars_analyzed = 0  # characters handed to the analyzer
        self.values_analyzed = 0  # strings handed to the analyzer (cache misses)
        self.values_seen = 0  # strings visited (hits, misses and trivially clean ones)
        self.cache_hits = 0
        self.entities_found: Counter[str] = Counter()

    def reset(self) -> None:
        with self._lock:
            self._reset_unlocked()

    def _add(self, *, seen: int = 0, hits: int = 0, analyzed: int = 0, chars: int = 0,
             entities: Sequence[Entity] = ()) -> None:
        with self._lock:
            self.values_seen += seen
            self.cache_hits += hits
            self.values_analyzed += analyzed
            self.chars_analyzed += chars
            for e in entities:
                self.entities_found[e.kind] += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "chars_analyzed": self.chars_analyzed,
                "values_analyzed": self.values_analyzed,
                "values_seen": self.values_seen,
                "cache_hits": self.cache_hits,
                "entities_found": dict(self.entities_found),
            }

    def __repr__(self) -> str:
        return f"RedactionStats({self.as_dict()})"


# --------------------------------------------------------------------------------------------
# Tokens and markers
# --------------------------------------------------------------------------------------------
TOKEN_HEX_CHARS = 32
TOKEN_RE = re.compile(r"<([A-Z][A-Z0-9_]{0,63}):([0-9a-f]{32})>")
_KIND_SAFE = re.compile(r"[^A-Z0-9_]")
_TOKEN_DOMAIN = b"langgraph-securesaver/redaction/token/v1\x00"


def _kind_label(kind: str) -> str:
    label = _KIND_SAFE.sub("_", kind.upper())[:64] or "PII"
    return label if label[0].isalpha() else "PII_" + label[:59]


def normalize_value(kind: str, value: str) -> str:
    """The form of ``value`` that is tokenized: equal normalized values share a token."""
    v = unicodedata.normalize("NFKC", value)
    if not v.isascii():  # the same value in other digits/dots gets the same token
        v = "".join(str(unicodedata.decimal(c)) if c.isdecimal() else
                    "." if c in "\u3002\uff61" else c for c in v
                    if unicodedata.category(c) != "Cf")
    v = v.strip()
    if kind == "EMAIL_ADDRESS":
        return v.casefold()
    if kind in ("PHONE_NUMBER", "CN_MOBILE"):
        digits = "".join(c for c in v if c.isdigit())
        if kind == "CN_MOBILE" and len(digits) > 11:
            digits = digits[-11:]
        return ("+" if v.startswith("+") and kind == "PHONE_NUMBER" else "") + digits
    if kind in ("CN_RESIDENT_ID", "CREDIT_CARD", "IBAN_CODE", "US_SSN"):
        return "".join(c for c in v if c not in " -.").upper()
    if kind == "IP_ADDRESS":
        try:
            return ipaddress.ip_interface(v).compressed
        except ValueError:
            return v.lower()
    return v


def make_token(token_key: bytes, kind: str, value: str) -> str:
    """``<KIND:hex>`` with hex = the first 128 bits of HMAC-SHA256(key, kind, normalized value)."""
    label = _kind_label(kind)
    msg = (_TOKEN_DOMAIN + label.encode("ascii") + b"\x00"
           + normalize_value(kind, value).encode("utf-8", "surrogatepass"))
    digest = hmac.new(token_key, msg, hashlib.sha256).hexdigest()[:TOKEN_HEX_CHARS]
    return f"<{label}:{digest}>"


def mask_marker(kind: str) -> str:
    return f"<{_kind_label(kind)}:masked>"


# --------------------------------------------------------------------------------------------
# Analysis view: compatibility forms folded to ASCII, CJK blanked, known markers blanked, with
# an exact map from view offsets back to the original text
# --------------------------------------------------------------------------------------------
_CJK_RE = re.compile(
    "["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi
    "\u2ff0-\u2fff\u3001\u3003-\u303f"  # ideographic description, CJK symbols (not U+3000/3002)
    "\u3040-\u31ff"  # kana, bopomofo, Hangul compatibility, CJK strokes
    "\u3200-\u4dbf"  # enclosed CJK, CJK compatibility, extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f"
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\ufe30-\ufe4f"  # CJK compatibility forms
    "\U00020000-\U0003134f"  # CJK extensions B-G
    "]"
)
# The blank is NUL: not a word character (so \b works), not whitespace and not phone-number
# punctuation (so "2023年11月15日" does not turn into the digit groups "2023 11 15").
_BLANK = "\x00"
_IDEO_STOP = "\u3002"  # 。 (and ｡): a dot between ASCII letters/digits (e-mail, domain), else blank
_IDEO_DOT = re.compile(r"(?<=[A-Za-z0-9])\u3002(?=[A-Za-z0-9])")
_EXTRA_DASHES = frozenset("\u2212\u2043\ufe63\uff0d\u02d7\u2796")


def _fold_char(ch: str) -> str:
    """The analysis form of one non-ASCII character: '' (dropped), one or more ASCII
    characters, or the blank."""
    if ch in "\u3002\uff61":
        return _IDEO_STOP
    if _CJK_RE.match(ch):
        return _BLANK
    cat = unicodedata.category(ch)
    if cat == "Nd":
        return str(unicodedata.decimal(ch, 0))
    if cat == "Zs" or ch in "\u2028\u2029\x85":
        return " "
    if cat == "Pd" or ch in _EXTRA_DASHES:
        return "-"
    if cat in ("Cf", "Mn", "Me"):
        return ""  # zero-width and bidi controls, soft hyphen, combining marks
    folded = unicodedata.normalize("NFKC", ch)
    if folded.isascii() and folded:
        return folded
    base = unicodedata.normalize("NFKD", ch)[:1]
    if base.isascii() and base.isalpha():
        return base  # é -> e
    return _BLANK


class _FoldTable(dict[int, str]):
    """``str.translate`` table built on demand; records characters that change length."""

    def __init__(self) -> None:
        super().__init__((i, chr(i)) for i in range(128))
        self.non_unit: set[int] = set()

    def __missing__(self, cp: int) -> str:
        folded = _fold_char(chr(cp))
        if len(folded) != 1:
            self.non_unit.add(cp)
        self[cp] = folded
        return folded


_FOLD = _FoldTable()
_SLICE = 65_536


def fold_text(text: str) -> tuple[str, list[int] | None]:
    """(folded text, offsets): ``offsets[i]`` is the index in ``text`` of the character that
    produced folded character ``i`` (plus a final ``len(text)``), or None when every
    character folded to exactly one (offsets are then the identity)."""
    if text.isascii():
        return text, None
    if len(text) <= _SLICE:
        view = text.translate(_FOLD)
    else:  # slices: no single C call holds the GIL for long (async callers' event loop)
        view = "".join(text[i:i + _SLICE].translate(_FOLD) for i in range(0, len(text), _SLICE))
    if _IDEO_STOP in view:
        view = _IDEO_DOT.sub(".", view).replace(_IDEO_STOP, _BLANK)
    non_unit = _FOLD.non_unit
    if len(view) == len(text) and (not non_unit or not any(
            not non_unit.isdisjoint(map(ord, set(text[i:i + _SLICE])))
            for i in range(0, len(text), _SLICE))):
        return view, None
    offsets: list[int] = []
    table = _FOLD
    for i, ch in enumerate(text):
        n = len(table[ord(ch)])
        if n == 1:
            offsets.append(i)
        elif n:
            offsets.extend([i] * n)
    offsets.append(len(text))
    return view, offsets


def _map_span(offsets: list[int] | None, start: int, end: int) -> tuple[int, int]:
    if offsets is None:
        return start, end
    if end <= start:
        return offsets[start], offsets[start]
    return offsets[start], offsets[end - 1] + 1


_MARKER_RE = re.compile(r"<([A-Z][A-Z0-9_]{0,63}):(?:[0-9a-f]{32}|masked)>")
# Labels of markers the redactor itself writes besides entity kinds.
WITHHELD = "WITHHELD"
EMBEDDED_PII = "EMBEDDED_PII"
_OWN_LABELS = frozenset({WITHHELD, EMBEDDED_PII, "PII"})


def _blank_markers(view: str, labels: frozenset[str] | None) -> str:
    """Blank the tokens and masks of known kinds (never analyzed again). A marker-shaped
    string with any other label is analyzed like any text (``<AKIA…:masked>`` is a key)."""
    if "<" not in view:
        return view

    def blank(m: re.Match[str]) -> str:
        if labels is None or m.group(1) in labels:
            return _BLANK * len(m.group(0))
        return m.group(0)

    return _MARKER_RE.sub(blank, view)


def analysis_view(text: str, labels: frozenset[str] | None = None) -> str:
    """The text the recognizers see (see :func:`fold_text`), markers of ``labels`` blanked
    (every marker when ``labels`` is None)."""
    return _blank_markers(fold_text(text)[0], labels)


# A data URL's base64 payload: decoded and analyzed as text (when it is text), never as
# base64 gibberish; what follows it is analyzed as usual.
_DATA_URL = re.compile(
    r"data:[A-Za-z0-9.+\-]{1,64}/[A-Za-z0-9.+\-]{1,64}(?:;[A-Za-z0-9.+\-=]{1,64}){0,4};base64,"
    r"(?P<p>[A-Za-z0-9+/_\-]{16,}={0,2})(?=[\s\"'`)>\],;}\x00]|$)", re.ASCII)
_DATA_URL_DECODE_MAX = 4_000_000


def _decode_payload(payload: str) -> str | None:
    """The payload as text, or None if it is not base64 of UTF-8 text."""
    import base64
    import binascii

    if len(payload) > _DATA_URL_DECODE_MAX:
        return None
    raw = payload.replace("-", "+").replace("_", "/")
    raw += "=" * (-len(raw) % 4)
    try:
        data = base64.b64decode(raw, validate=True)
        text = data.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if not text or sum(1 for c in text[:4096] if c.isprintable() or c in "\t\r\n") < 0.9 * min(
            len(text), 4096):
        return None
    return text


def _may_have_pii(s: str) -> bool:
    """False only for text in which no built-in recognizer can match (cheap, conservative):
    non-ASCII text always goes to the analysis view and its own pre-filter."""
    if len(s) > _SLICE:
        return True  # long text is pre-filtered chunk by chunk in _raw_detect
    return not s.isascii() or CANDIDATE_RE.search(s) is not None


CHUNK_OVERLAP = 512  # kept for compatibility; long text now overlaps by SECRET_OVERLAP
SECRET_OVERLAP = 4096
# Joins the strings of one JSON document for a single analyzer call: NUL is blank to every
# recognizer (not a word character, not whitespace, not phone punctuation).
_BATCH_SEP = "\x00\x00\n\x00\x00"

# Tie-breakers when detections overlap: higher score, then longer span, then this priority.
_PRIORITY = {API_SECRET: 9, "CN_RESIDENT_ID": 8, "CREDIT_CARD": 7, "IBAN_CODE": 7,
             "EMAIL_ADDRESS": 6, "CN_MOBILE": 6, "US_SSN": 5, "IP_ADDRESS": 5, "CRYPTO": 5,
             "PHONE_NUMBER": 3}


_JSON_WS = " \t\r\n"


def _looks_like_json(s: str) -> bool:
    if len(s) < 2:
        return False
    head, tail = s[0], s[-1]
    if head in _JSON_WS or tail in _JSON_WS:
        head, tail = s.lstrip()[:1], s.rstrip()[-1:]
    return (head == "{" and tail == "}") or (head == "[" and tail == "]")


def _dump_like(original: str, value: Any) -> str:
    """Serialize ``value`` in roughly the style of ``original``."""
    ensure_ascii = original.isascii() and "\\u" in original
    if "\n" in original.strip():
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=2)
    if ": " in original or ", " in original:
        return json.dumps(value, ensure_ascii=ensure_ascii)
    return json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# Caches
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Cached:
    text: str
    vault: tuple[VaultEntry, ...]
    entities: tuple[Entity, ...]


class _Cache:
    """A bounded map: at most ``max_entries`` entries and about ``max_chars`` characters.

    Reads take no lock (a dict lookup is atomic); writes take one. Eviction is first-in,
    first-out: an entry that is still in use is simply recomputed (and re-cached) after
    eviction, which costs one analysis.
    """

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        item = self._data.get(key)
        return None if item is None else item[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if self._max_entries <= 0 or size > self._max_chars // 4:
            return  # one huge value must not flush everything else
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            self._data[key] = (value, size)
            self._chars += size
            while self._data and (len(self._data) > self._max_entries
                                  or self._chars > self._max_chars):
                self._chars -= self._data.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._chars = 0

    def __len__(self) -> int:
        return len(self._data)


class _StrongRef:
    """Stands in for a weak reference to an object that does not support weak references."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


class _IdentityCache:
    """Per-object results, first-in first-out, lock-free reads, bounded by entry count and an
    approximate size budget.

    Entries are keyed by ``id(obj)`` and hold only a weak reference to ``obj`` (the cache
    never keeps a message alive). When an object dies its key is queued and purged on the
    next write; until then ``get`` ignores the entry because the reference is dead.
    """

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self._data: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._chars = 0
        self._dead: list[int] = []
        self._lock = threading.Lock()

    def get(self, obj: Any) -> tuple[Any, ...] | None:
        entry = self._data.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return None
        return entry

    def put(self, obj: Any, size: int, *fields: Any) -> None:
        if self._max_entries <= 0 or size > self._max_chars // 4:
            return
        key = id(obj)
        try:
            ref: Any = weakref.KeyedRef(obj, self._gone, key)
        except TypeError:
            ref = _StrongRef(obj)
        with self._lock:
            while self._dead:
                dead = self._dead.pop()
                entry = self._data.get(dead)
                if entry is not None and entry[0]() is None:
                    self._chars -= self._data.pop(dead)[1]
            old = self._data.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            self._data[key] = (ref, size, *fields)
            self._chars += size
            while self._data and (len(self._data) > self._max_entries
                                  or self._chars > self._max_chars):
                self._chars -= self._data.popitem(last=False)[1][1]

    def _gone(self, ref: Any) -> None:
        self._dead.append(ref.key)  # no dict mutation here: this may run inside a GC pass

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._dead.clear()
            self._chars = 0


def _vault_size(vault: Sequence[VaultEntry]) -> int:
    return sum(len(v.value) + 80 for v in vault)


# --------------------------------------------------------------------------------------------
# Per-call state
# --------------------------------------------------------------------------------------------
class _Overrun(Exception):  # internal control flow: never escapes the redactor
    """The analysis of one value ran past its time budget."""


class _Call:
    """State of one call: context, policy, key, collected vault entries and counters."""

    __slots__ = ("analyzed", "chars", "ctx", "found", "hits", "key", "policy", "scopes", "seen")

    def __init__(self, ctx: bytes, key: bytes, policy: RedactionPolicy) -> None:
        self.ctx = ctx
        self.key = key
        self.policy = policy
        self.scopes: list[dict[str, VaultEntry]] = [{}]
        self.seen = 0
        self.hits = 0
        self.analyzed = 0
        self.chars = 0
        self.found: list[Entity] = []

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
class Redactor:
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
        self._text_cache = _Cache(cache_size, cache_max_chars)
        # message content -> redacted message, keyed by (context, class, marshal of fields)
        self._message_cache = _Cache(cache_size, cache_max_chars)
        # the same message object seen again (fields compared by identity first)
        self._identity_cache = _IdentityCache(cache_size, cache_max_chars)
        # stored message (+ the originals of its tokens) -> marshal dump of the restored one
        self._restore_cache = _Cache(cache_size, cache_max_chars)
        # per conversation: the last list of messages and its results (prefix reuse)
        self._list_cache = _Cache(max(cache_size // 16, 1) if cache_size > 0 else 0,
                                  cache_max_chars)
        self._stats = RedactionStats()
        self._process_key = secrets.token_bytes(32)
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
            kinds = set(supported) | set(self.policy.actions) | _OWN_LABELS
            for sub in self.policy.channels.values():
                if sub is not None:
                    kinds |= set(sub.actions)
            self._known_labels = frozenset(_kind_label(k) for k in kinds)
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

    # -- public API --------------------------------------------------------------------------
    def redact(self, text: str, *, token_key: bytes | None = None,
               channel: str | None = None) -> RedactionResult:
        """Redact one string as plain text (no JSON parsing); for trying a policy out.

        Without ``token_key`` tokens use a random key made once per ``Redactor``: they are
        stable within the process and meaningless outside it.
        """
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
                     token_key: bytes) -> tuple[Any, list[VaultEntry]]:
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
        try:
            result = self._walker(call).walk(value)
        finally:
            self._flush(call)
        return result, list(call.scopes[0].values())

    def find_tokens(self, value: Any) -> list[str]:
        """The distinct tokens in ``value``, in order of first appearance."""
        return list(self._find_tokens(value, None))

    def _find_tokens(self, value: Any,
                     dumps: dict[int, tuple[Any, bytes, list[str]]] | None) -> dict[str, None]:
        found: dict[str, None] = {}

        def on_str(s: str, depth: int, is_key: bool) -> str:
            if "<" in s:
                for m in TOKEN_RE.finditer(s):
                    found.setdefault(m.group(0), None)
            return s

        def on_message(msg: Any, depth: int) -> Any:
            dumped = _dump_message(msg)
            if dumped is None:
                return walker.walk_message_guarded(msg, depth)
            tokens = _tokens_in_dump(dumped)
            for token in tokens:
                found.setdefault(token, None)
            if dumps is not None:
                dumps[id(msg)] = (msg, dumped, tokens)
            return msg

        walker = Walker(on_str, max_depth=self.policy.max_depth, on_message=on_message)
        walker.walk(value)
        return found

    def restore_value(self, value: Any,
                      lookup: Callable[[Sequence[str]], Mapping[str, str]], *,
                      originals: Mapping[str, str] | None = None) -> Any:
        """A copy of ``value`` with tokens replaced by the originals ``lookup`` returns.

        ``lookup`` gets every distinct token once and returns the originals it still has;
        tokens it does not return (erased values) stay as they are. A caller that already
        knows the tokens' originals passes them as ``originals`` (one walk instead of two).
        Inside JSON strings the
        originals are inserted JSON-escaped. Masked values (``<KIND:masked>``) stay masked.
        Unchanged sub-objects (e.g. messages without tokens) are shared with ``value``;
        messages that change are new objects owned by the caller.
        """
        dumps: dict[int, tuple[Any, bytes, list[str]]] = {}
        if originals is None:
            tokens = self._find_tokens(value, dumps)
            if not tokens:
                return value
            originals = dict(lookup(list(tokens)))
        # ``originals`` given: the caller already knows the tokens (e.g. from a scan of the
        # serialized bytes) and their values, so the separate token-finding pass is skipped
        originals = {t: v for t, v in originals.items() if isinstance(v, str)}
        if not originals:
            return value

        def replace(m: re.Match[str], escape: bool) -> str:
            original = originals.get(m.group(0))
            if original is None:
                return m.group(0)
            return json.dumps(original, ensure_ascii=False)[1:-1] if escape else original

        def on_str(s: str, depth: int, is_key: bool) -> str:
            if "<" not in s or not TOKEN_RE.search(s):
                return s
            escape = not is_key and _looks_like_json(s) and _is_json(s)
            out = TOKEN_RE.sub(lambda m: replace(m, escape), s)
            return s if out == s else out

        def on_message(msg: Any, depth: int) -> Any:
            seen = dumps.get(id(msg))
            if seen is not None and seen[0] is msg:
                dumped, found = seen[1], seen[2]
            else:
                maybe = _dump_message(msg)
                if maybe is None:
                    return walker.walk_message_guarded(msg, depth)
                dumped, found = maybe, _tokens_in_dump(maybe)
            if originals.keys().isdisjoint(found):
                return msg  # nothing to put back in this message
            key = (type(msg), dumped, tuple(map(originals.get, found)))
            restored_dump = self._restore_cache.get(key)
            if restored_dump is not None:  # rebuild a private copy (the graph may mutate it)
                values, extra = marshal.loads(restored_dump)  # noqa: S302 - our own bytes
                update = dict(zip(msg.__dict__, values, strict=True))
                if extra:
                    update.update(extra)
                    return msg.model_copy(update=update)
                clone = copy.copy(msg)  # pydantic's __copy__: own __dict__, fields set, extras
                clone.__dict__.update(update)
                return clone
            restored = walker.walk_message_guarded(msg, depth)
            restored_dump = _dump_message(restored)
            if restored_dump is not None:
                self._restore_cache.put(key, restored_dump,
                                        len(dumped) + len(restored_dump) + 256)
            return restored

        def on_message_list(messages: list[Any], depth: int) -> list[Any]:
            found_per = self._tokens_per_message(messages)
            if found_per is None:  # a message that marshal cannot copy: one at a time
                out = [on_message(m, depth + 1) for m in messages]
            else:
                keys = originals.keys()
                out = [m if keys.isdisjoint(found) else on_message(m, depth + 1)
                       for m, found in zip(messages, found_per, strict=True)]
            return messages if all(a is b for a, b in zip(out, messages, strict=True)) else out

        walker = Walker(on_str, max_depth=self.policy.max_depth, on_message=on_message,
                        on_message_list=on_message_list)
        return walker.walk(value)

    def _tokens_per_message(self, messages: list[Any]) -> list[list[str]] | None:
        """The tokens in each message of a list (the ``messages`` channel read back), reusing
        the previous read's answers for the longest prefix whose fields equal a deep (marshal)
        snapshot taken then: a conversation read every turn is scanned only in its new tail.
        None when some message cannot be snapshotted (the caller then checks each one)."""
        try:
            values = [(tuple(m.__dict__.values()), m.__pydantic_extra__) for m in messages]
        except AttributeError:
            return None
        first = messages[0]
        head = values[0][0]
        key = ("restore-list", type(first), getattr(first, "id", None),
               head[0] if head and type(head[0]) is str else None)
        state = self._list_cache.get(key)
        prefix = 0
        if state is not None:
            old_values = state[0]
            n = len(old_values)
            if n <= len(values) and values[:n] == old_values:
                prefix = n
            else:
                for i, (new, old) in enumerate(zip(values, old_values, strict=False)):
                    if new != old:
                        break
                    prefix = i + 1
        if state is not None and prefix == len(values):
            return list(state[1][:prefix])
        try:  # a private deep copy of the new tail: later in-place edits cannot match it
            tail_blob = marshal.dumps(values[prefix:], 0)
        except ValueError:
            return None
        found_per: list[list[str]] = list(state[1][:prefix]) if state is not None else []
        for m in messages[prefix:]:
            dumped = _dump_message(m)
            if dumped is None:
                return None
            found_per.append(_tokens_in_dump(dumped))
        tail = marshal.loads(tail_blob)  # noqa: S302 - bytes this process just wrote
        snapshot = (list(state[0][:prefix]) if state is not None else []) + tail
        size = (state[2] if state is not None and prefix == len(state[0]) else 0) + len(tail_blob)
        self._list_cache.put(key, (snapshot, found_per, size), size + 64)
        return found_per

    # -- internals ---------------------------------------------------------------------------
    def _check_key(self, token_key: bytes | None, required: bool = False) -> bytes:
        if token_key is None:
            if required:
                raise ConfigurationError("redact_value needs a token_key (bytes)")
            return self._process_key
        if not isinstance(token_key, (bytes, bytearray)) or len(token_key) < 16:
            raise ConfigurationError("token_key must be at least 16 bytes")
        return bytes(token_key)

    def _new_call(self, policy: RedactionPolicy, key: bytes) -> _Call:
        ctx = hashlib.blake2b(key, digest_size=16, person=b"ss-redact-ctx").digest()
        ctx += policy.fingerprint.encode("ascii")
        return _Call(ctx, key, policy)

    def _flush(self, call: _Call) -> None:
        self._stats._add(seen=call.seen, hits=call.hits, analyzed=call.analyzed,
                         chars=call.chars, entities=call.found)

    def _walker(self, call: _Call) -> Walker:
        walker: Walker

        def on_str(s: str, depth: int, is_key: bool) -> str:
            if not is_key and _looks_like_json(s):
                return self._redact_json(s, call, depth)
            entry = self._redact_plain(s, call)
            if entry.vault:
                call.add(entry.vault)
            return entry.text

        def on_message(msg: Any, depth: int) -> Any:
            return self._redact_message(msg, call, walker, depth)[0]

        def on_message_list(messages: list[Any], depth: int) -> list[Any]:
            return self._redact_message_list(messages, call, walker, depth)

        walker = Walker(on_str, max_depth=call.policy.max_depth, on_message=on_message,
                        on_message_list=on_message_list)
        return walker

    def _redact_message_list(self, messages: list[Any], call: _Call, walker: Walker,
                             depth: int) -> list[Any]:
        """A list of messages (the ``messages`` channel): reuse the previous call's results
        for the longest prefix of messages whose fields equal a deep snapshot taken then.

        The comparison is C-level equality of every message's field values with a marshal
        copy of them, so a message replaced, edited in place (even deep inside a dict) or
        given an id since the last call is redone; only what changed, and the new suffix, go
        through the per-message path.
        """
        try:
            values = [(tuple(m.__dict__.values()), m.__pydantic_extra__) for m in messages]
        except AttributeError:  # a message class without __dict__: no list-level reuse
            return [self._redact_message(m, call, walker, depth + 1)[0] for m in messages]
        first = messages[0]
        head = values[0][0]
        thread_key = (call.ctx, type(first), getattr(first, "id", None),
                      head[0] if head and type(head[0]) is str else None)
        state = self._list_cache.get(thread_key)
        prefix = 0
        if state is not None:
            old_snapshots = state[0]
            n = len(old_snapshots)
            if n <= len(values) and values[:n] == old_snapshots:
                prefix = n
            else:  # longest equal prefix (e.g. a message was removed or edited)
                for n, (new, old) in enumerate(zip(values, old_snapshots, strict=False)):
                    if new != old:
                        prefix = n
                        break
                else:
                    prefix = min(len(values), len(old_snapshots))
        results: list[Any] = list(state[1][:prefix]) if state is not None else []
        snapshots: list[Any] = list(state[0][:prefix]) if state is not None else []
        cacheable = True
        call.push()
        try:
            if state is not None and prefix:
                call.add(state[2] if prefix == len(state[0]) else
                         tuple(e for v in state[3][:prefix] for e in v))
                call.hits += prefix
            vaults: list[tuple[VaultEntry, ...]] = list(state[3][:prefix]) if state else []
            for m in messages[prefix:]:
                result, snapshot, vault = self._redact_message(m, call, walker, depth + 1)
                results.append(result)
                snapshots.append(snapshot)
                vaults.append(vault)
                cacheable = cacheable and snapshot is not None
        finally:
            union = call.pop()
        if cacheable:  # the snapshots and results are shared with the per-message caches
            self._list_cache.put(thread_key, (snapshots, results, union, vaults),
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
            try:
                result = walker.walk_message_guarded(msg, depth)
            finally:
                vault = call.pop()
            if dumped is not None:
                self._message_cache.put(content_key, (result, vault),
                                        len(dumped) + _vault_size(vault) + 256)
        if dumped is None:
            return result, None, vault
        snapshot = marshal.loads(dumped)  # noqa: S302 - bytes we dumped ourselves
        self._identity_cache.put(msg, len(dumped) + 256, call.ctx, snapshot, result, vault)
        return result, snapshot, vault

    def _redact_json(self, s: str, call: _Call, depth: int) -> str:
        key = (call.ctx + b"/json", s)
        hit: _Cached | None = self._text_cache.get(key)
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
        out = s if walked is parsed else _dump_like(s, walked)
        self._text_cache.put(key, _Cached(out, vault, ()), 2 * len(s) + _vault_size(vault))
        if out is not s:
            self._text_cache.put((call.ctx + b"/json", out), _Cached(out, (), ()), len(out))
        return out

    def _prefetch(self, parsed: Any, call: _Call, depth: int) -> None:
        """Analyze the uncached strings of a parsed JSON document in a few batched analyzer
        calls (one call per string costs ~0.3 ms of fixed overhead), filling the cache."""
        pending: dict[str, None] = {}

        def on_str(s: str, _depth: int, is_key: bool) -> str:
            if (s and (is_key or not _looks_like_json(s))
                    and len(s) <= call.policy.max_chars // 4
                    and self._text_cache.get((call.ctx, s)) is None
                    and (self._custom_analyzer or _may_have_pii(s))):
                pending[s] = None
            return s

        Walker(on_str, max_depth=call.policy.max_depth).walk(parsed, depth)
        if len(pending) < 2:
            return
        batch: list[str] = []
        size = 0
        for text in pending:
            if batch and size + len(text) + len(_BATCH_SEP) > call.policy.max_chars:
                self._redact_batch(batch, call)
                batch, size = [], 0
            batch.append(text)
            size += len(text) + len(_BATCH_SEP)
        if batch:
            self._redact_batch(batch, call)

    def _redact_batch(self, texts: list[str], call: _Call) -> None:
        """Analyze ``texts`` joined by a separator no recognizer matches across; cache each."""
        joined = _BATCH_SEP.join(texts)
        try:
            found = self._raw_detect(joined, call.policy)
        except _Overrun:
            return  # nothing cached: each string is then analyzed on its own, with its budget
        starts: list[int] = []
        pos = 0
        for text in texts:
            starts.append(pos)
            pos += len(text) + len(_BATCH_SEP)
        per_text: list[dict[tuple[str, int, int], float]] = [{} for _ in texts]
        for (kind, start, end), score in found.items():
            i = bisect.bisect_right(starts, start) - 1
            while i < len(texts) and starts[i] < end:  # clamp (split) to each text it covers
                lo = max(start, starts[i]) - starts[i]
                hi = min(end, starts[i] + len(texts[i])) - starts[i]
                if hi > lo:
                    k = (kind, lo, hi)
                    per_text[i][k] = max(per_text[i].get(k, 0.0), score)
                i += 1
        for text, raw in zip(texts, per_text, strict=True):
            self._store_plain(text, self._finish(text, raw, call.policy), call)

    def _redact_plain(self, s: str, call: _Call) -> _Cached:
        call.seen += 1
        if not s:
            return _Cached(s, (), ())
        key = (call.ctx, s)
        hit: _Cached | None = self._text_cache.get(key)
        if hit is not None:
            call.hits += 1
            return hit
        if not self._custom_analyzer and not _may_have_pii(s):
            return _Cached(s, (), ())
        try:
            entities = self._detect(s, call.policy)
        except _Overrun as exc:
            return self._withheld(s, call, str(exc))
        return self._store_plain(s, entities, call)

    def _withheld(self, s: str, call: _Call, reason: str) -> _Cached:
        """The analysis of ``s`` ran past the policy's time budget: never return it in clear."""
        call.analyzed += 1
        call.chars += len(s)
        if call.policy.on_timeout == "raise":
            raise RedactionError(
                f"redaction of a {len(s)}-character string ran past the time budget "
                f"({call.policy.time_budget} s per {call.policy.max_chars} characters) or found "
                f"more than max_detections={call.policy.max_detections}; it was not stored")
        logger.warning("redaction of a %d-character string hit the %s; the whole value was "
                       "withheld (masked)", len(s), reason)
        marker = mask_marker(WITHHELD)
        entity = Entity(WITHHELD, 0, len(s), 1.0, reason)  # text: why, never the value
        call.found.append(entity)
        return _Cached(marker, (), (entity,))  # not cached: a later call may finish in time

    def _store_plain(self, s: str, entities: list[Entity], call: _Call) -> _Cached:
        out, vault = self._apply(s, entities, call.policy, call.key)
        entry = _Cached(out, tuple(vault), tuple(entities))
        call.analyzed += 1
        call.chars += len(s)
        call.found.extend(entities)
        self._text_cache.put((call.ctx, s), entry, 2 * len(s) + _vault_size(vault) + 64)
        if out != s:  # a redaction output is done: never analyze it again
            self._text_cache.put((call.ctx, out), _Cached(out, (), ()), len(out) + 64)
        return entry

    def _analyze(self, text: str, entities: Sequence[str],
                 threshold: float) -> list[RecognizerResult]:
        if not entities:
            return []
        results: list[RecognizerResult] = self.analyzer.analyze(
            text=text, language=LANGUAGE, entities=list(entities),
            nlp_artifacts=self._artifacts, score_threshold=threshold)
        return results

    def _detect(self, text: str, policy: RedactionPolicy) -> list[Entity]:
        return self._finish(text, self._raw_detect(text, policy), policy)

    def _raw_detect(self, text: str, policy: RedactionPolicy,
                    deadline: float | None = None,
                    nested: bool = False) -> dict[tuple[str, int, int], float]:
        """{(kind, start, end): score} for every detection in ``text``, before filtering.

        Raises ``_Overrun`` once the analysis has taken longer than the policy's budget
        (``time_budget`` seconds per ``max_chars`` characters, at least one unit)."""
        if len(text) > policy.hard_max_chars:
            raise RedactionError(
                f"a {len(text)}-character string exceeds hard_max_chars="
                f"{policy.hard_max_chars}; it was not stored. Raise the limit in the policy or "
                "keep such payloads out of the graph state")
        self._ensure_engine()
        clock = self._clock
        if deadline is None:
            units = max(1, -(-len(text) // policy.max_chars))
            deadline = clock() + policy.time_budget * units

        def check() -> None:
            if clock() > deadline:
                raise _Overrun("time budget")
            if len(found) > policy.max_detections:
                raise _Overrun("detection cap")

        pattern_entities = self._pattern_entities or ()
        folded, offsets = fold_text(text)
        view = _blank_markers(folded, self._known_labels)
        threshold = policy.score_threshold
        found: dict[tuple[str, int, int], float] = {}

        def collect(results: Sequence[RecognizerResult], offset: int = 0) -> None:
            for r in results:
                start, end = _map_span(offsets, r.start + offset, r.end + offset)
                k = (r.entity_type, start, end)
                if found.get(k, -1.0) < r.score:
                    found[k] = r.score

        if "base64," in view:
            view = self._data_urls(view, policy, deadline, nested, collect)
        if len(view) <= policy.max_chars:
            if not (self._prefilter and CANDIDATE_RE.search(view) is None):
                collect(self._analyze(view, pattern_entities, threshold))
                check()
        else:
            # Chunks overlap by SECRET_OVERLAP characters, so that any value shorter than that
            # is whole in some chunk; private-key blocks (longer) get one pass of their own.
            # Every regex call then scans at most max_chars characters: the GIL is released
            # often enough for the event loop of an async caller to keep running.
            logger.debug("analyzing a %d-character string in chunks of %d", len(text),
                         policy.max_chars)
            step = policy.max_chars - min(SECRET_OVERLAP, policy.max_chars // 2)
            for start in range(0, len(view), step):
                chunk = view[start:start + policy.max_chars]
                if not (self._prefilter and CANDIDATE_RE.search(chunk) is None):
                    collect(self._analyze(chunk, pattern_entities, threshold), start)
                    check()
                time.sleep(0)  # hand the GIL over between chunks (an event loop may wait)
                if start + policy.max_chars >= len(view):
                    break
            if API_SECRET in pattern_entities:
                collect([RecognizerResult(API_SECRET, s, e, score)
                         for s, e, score in private_key_spans(view)])
                check()
        if self._ner_entities and not nested:
            ner_text = _MARKER_RE.sub(lambda m: " " * len(m.group(0)), text)
            for r in self.analyzer.analyze(text=ner_text, language=LANGUAGE,
                                           entities=list(self._ner_entities),
                                           score_threshold=threshold):
                k = (r.entity_type, r.start, r.end)
                if found.get(k, -1.0) < r.score:
                    found[k] = r.score
            check()
        return found

    def _data_urls(self, view: str, policy: RedactionPolicy, deadline: float, nested: bool,
                   collect: Callable[[Sequence[RecognizerResult]], None]) -> str:
        """Decode each data URL's base64 payload: a payload whose text holds anything
        detectable is reported whole as ``EMBEDDED_PII``; the payload is then blanked in the
        view (base64 is not text), and what follows it is analyzed as usual."""
        parts: list[str] = []
        pos = 0
        for m in _DATA_URL.finditer(view):
            start, end = m.span("p")
            decoded = None if nested else _decode_payload(m.group("p"))
            if decoded is not None and self._raw_detect(decoded, policy, deadline, True):
                collect([RecognizerResult(EMBEDDED_PII, start, end, 1.0)])
            parts.append(view[pos:start])
            parts.append(_BLANK * (end - start))
            pos = end
        if not parts:
            return view
        parts.append(view[pos:])
        return "".join(parts)

    @staticmethod
    def _finish(text: str, found: Mapping[tuple[str, int, int], float],
                policy: RedactionPolicy) -> list[Entity]:
        """Apply the allowlist and label vetoes, then resolve overlaps."""
        candidates = []
        for (kind, start, end), score in found.items():
            value = text[start:end]
            if (not value.strip() or policy.is_allowed(value)
                    or label_veto(kind, text, start, end)):
                continue
            candidates.append(Entity(kind, start, end, score, value))
        return _resolve_overlaps(candidates)

    @staticmethod
    def _apply(text: str, entities: Sequence[Entity], policy: RedactionPolicy,
               key: bytes) -> tuple[str, list[VaultEntry]]:
        parts: list[str] = []
        vault: dict[str, VaultEntry] = {}
        pos = 0
        for e in entities:
            action = policy.action_for(e.kind)
            if action is Action.KEEP:
                continue
            parts.append(text[pos:e.start])
            if action is Action.TOKENIZE:
                token = make_token(key, e.kind, e.text)
                parts.append(token)
                vault.setdefault(token, VaultEntry(token, e.kind, e.text))
            elif action is Action.MASK:
                parts.append(mask_marker(e.kind))
            pos = e.end
        if not parts:
            return text, []
        parts.append(text[pos:])
        return "".join(parts), list(vault.values())


def _resolve_overlaps(candidates: list[Entity]) -> list[Entity]:
    """Keep the best of overlapping detections: higher score, longer span, then priority."""
    ranked = sorted(candidates, key=lambda e: (-e.score, -(e.end - e.start),
                                               -_PRIORITY.get(e.kind, 1), e.start))
    starts: list[int] = []  # sorted, non-overlapping accepted spans
    taken: list[Entity] = []
    for e in ranked:
        i = bisect.bisect_right(starts, e.start)
        if i > 0 and taken[i - 1].end > e.start:
            continue
        if i < len(taken) and taken[i].start < e.end:
            continue
        starts.insert(i, e.start)
        taken.insert(i, e)
    return taken


_TOKEN_BYTES_RE = re.compile(rb"<[A-Z][A-Z0-9_]{0,63}:[0-9a-f]{32}>")


def _dump_message(msg: Any) -> bytes | None:
    """A marshal dump of a message's fields, or None if it has an unmarshalable field or is
    nested too deeply (callers then walk it)."""
    fields = getattr(msg, "__dict__", None)
    if not isinstance(fields, dict):
        return None
    try:
        return marshal.dumps((tuple(fields.values()),
                              getattr(msg, "__pydantic_extra__", None)), 0)
    except ValueError:
        return None


def _tokens_in_dump(dumped: bytes) -> list[str]:
    """Tokens in a marshal dump (strings are UTF-8 there, so tokens appear verbatim)."""
    if b"<" not in dumped:
        return []
    return [t.decode("ascii") for t in _TOKEN_BYTES_RE.findall(dumped)]


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except (ValueError, RecursionError):
        return False
    return True
