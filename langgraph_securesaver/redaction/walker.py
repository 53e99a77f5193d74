"""Copy-on-write traversal of LangGraph state.

:class:`Walker` returns a copy of a value in which every string has been passed through a
callback. Nothing reachable from the input is mutated: a container is rebuilt only when
something inside it changed, and unchanged sub-objects are shared with the input (treat the
result as read-only).

Handled: ``str`` (and string dictionary keys), ``str`` subclasses (rebuilt as the same class
when it accepts a string, else returned as a plain ``str`` once changed), ``bytes`` and
``bytearray`` that decode as UTF-8 (walked as text, re-encoded when changed), exceptions
(an exception whose ``repr`` changes is replaced by that redacted ``repr``: the string
LangGraph's serializer stores for it anyway), ``dict`` (and subclasses), ``list``,
``tuple`` (and named tuples), ``set``/``frozenset``, dataclass instances, pydantic v2 models,
LangChain messages, and LangGraph ``Send``. Numbers (``int``, ``float``, ``Decimal``) go to
an ``on_number`` callback with the name of the nearest key or field, when one is given (as
dictionary keys too: the name of the dictionary). Left
alone (returned as the same object): ``None``, ``memoryview`` and any other type.

LangChain messages: ``content`` (string or content blocks), ``tool_calls[*]["args"]``,
``invalid_tool_calls[*]["args"/"error"]``, ``tool_call_chunks[*]["args"]``,
``additional_kwargs`` (with ``tool_calls[*]["function"]["arguments"]`` and
``function_call["arguments"]`` only — names, ids and types stay), ``response_metadata`` and
``artifact`` are walked; ``id``, ``type``, ``name``, ``tool_call_id`` and ``status`` are kept.

Fail-closed limits: nesting deeper than ``max_depth`` and cycles raise ``RedactionError``
naming the path; so does a dictionary whose keys collide once transformed.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import operator
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from .errors import RedactionError

logger = logging.getLogger(__name__)

try:  # langchain-core comes with langgraph, but keep the walker usable without it
    from langchain_core.messages import BaseMessage as _BaseMessage
except ImportError:  # pragma: no cover
    _BaseMessage = None  # type: ignore[assignment,misc]

try:
    from pydantic import BaseModel as _PydanticModel
except ImportError:  # pragma: no cover
    _PydanticModel = None  # type: ignore[assignment,misc]

try:
    from langgraph.types import Send as _Send
except ImportError:  # pragma: no cover
    _Send = None  # type: ignore[assignment,misc]

# on_str(text, depth, is_key) -> new text
StrCallback = Callable[[str, int, bool], str]
# on_number(number, name) -> the number or what replaces it (name: the nearest key/field)
NumberCallback = Callable[[Any, "str | None"], Any]
#: (the strings of one list, tuple or set, depth) -> their results in order, or the same
#: sequence object when none changed
StrListCallback = Callable[[Sequence[str], int], Sequence[str]]
#: lists shorter than this go string by string (a batch only pays off for many strings)
STR_LIST_MIN = 8
_NUMBERS: frozenset[type] = frozenset({int, float, Decimal})

(_LEAF, _DICT, _LIST, _TUPLE, _SET, _MESSAGE, _PYDANTIC, _DATACLASS, _SEND, _STRSUB, _BYTES,
 _EXC) = range(12)
_KINDS: dict[type, int] = {t: _LEAF for t in (int, float, bool, type(None), complex,
                                              memoryview)}
_KINDS.update({dict: _DICT, list: _LIST, tuple: _TUPLE, set: _SET, frozenset: _SET,
               bytes: _BYTES, bytearray: _BYTES})


def _kind_of(cls: type) -> int:
    kind = _KINDS.get(cls)
    return _classify(cls) if kind is None else kind


def _classify(cls: type) -> int:
    """How values of ``cls`` are walked (cached per class)."""
    if issubclass(cls, str):
        kind = _STRSUB
    elif issubclass(cls, (bytes, bytearray)):
        kind = _BYTES
    elif issubclass(cls, BaseException):
        kind = _EXC
    elif issubclass(cls, (memoryview, int, float, complex)):
        kind = _LEAF
    elif issubclass(cls, dict):
        kind = _DICT
    elif issubclass(cls, list):
        kind = _LIST
    elif issubclass(cls, tuple):
        kind = _TUPLE
    elif issubclass(cls, (set, frozenset)):
        kind = _SET
    elif _BaseMessage is not None and issubclass(cls, _BaseMessage):
        kind = _MESSAGE
    elif _PydanticModel is not None and issubclass(cls, _PydanticModel):
        kind = _PYDANTIC
    elif dataclasses.is_dataclass(cls):
        kind = _DATACLASS
    elif _Send is not None and issubclass(cls, _Send):
        kind = _SEND
    else:
        kind = _LEAF  # any other object is passed through unchanged
    _KINDS[cls] = kind
    return kind
# Message fields that identify the message and must survive untouched.
MESSAGE_KEPT_FIELDS = frozenset({"id", "type", "name", "tool_call_id", "status", "example",
                                 "chunk_position"})
_TOOL_CALL_TEXT_KEYS = {"tool_calls": ("args",), "invalid_tool_calls": ("args", "error"),
                        "tool_call_chunks": ("args",)}


_SAFE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _path_key(key: Any) -> str:
    """A dictionary key for an error path; keys that could be personal data are not shown."""
    if isinstance(key, str) and _SAFE_KEY.fullmatch(key) and not any(c.isdigit() for c in key):
        return f"[{key!r}]"
    if isinstance(key, (int, bool)) or key is None:
        return f"[{key!r}]"
    return "[<key>]"


class _PathError(RedactionError):
    """A RedactionError that collects the path to the offending value on its way up."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []

    def __str__(self) -> str:
        where = "".join(reversed(self.path)) or "<root>"
        return f"{self.reason} (at {where})"


class Walker:
    """One traversal (create one per call: it memoizes shared sub-objects by identity)."""

    def __init__(self, on_str: StrCallback, *, max_depth: int,
                 on_message: Callable[[Any, int], Any] | None = None,
                 on_message_list: Callable[[list[Any], int], list[Any]] | None = None,
                 on_number: NumberCallback | None = None,
                 on_str_list: StrListCallback | None = None) -> None:
        self._on_str = on_str
        self._on_number = on_number
        #: a list, tuple or set of plain strings only goes to this callback whole, so that
        #: the strings of a large value can be analyzed in batches; same results as one
        #: ``on_str`` call per string
        self._on_str_list = on_str_list
        #: the name of what is being walked: the nearest dictionary key or field name
        self.name: str | None = None
        self._max_depth = max_depth
        self._on_message = on_message
        self._on_message_list = on_message_list
        self._memo: dict[int, Any] = {}
        self._active: set[int] = set()
        self._message_special: dict[str, Callable[[Any, int], Any]] = {
            "additional_kwargs": self._walk_additional_kwargs,
        }
        for field_name, keys in _TOOL_CALL_TEXT_KEYS.items():
            self._message_special[field_name] = self._tool_calls_walker(keys)

    # -- entry points ------------------------------------------------------------------------
    def walk(self, value: Any, depth: int = 0) -> Any:
        try:
            return self._walk(value, depth)
        except _PathError as exc:
            raise RedactionError(str(exc)) from None

    # -- dispatch ----------------------------------------------------------------------------
    def _walk(self, value: Any, depth: int) -> Any:
        cls = type(value)
        if cls is str:
            return self._on_str(value, depth, False)
        kind = _KINDS.get(cls)
        if kind is None:
            kind = _classify(cls)
        if kind == _LEAF:
            if self._on_number is not None and cls in _NUMBERS:
                return self._on_number(value, self.name)
            return value
        if kind == _STRSUB:
            return self._walk_str_subclass(value, depth)
        if kind == _BYTES:
            return self._walk_bytes(value, depth)
        if kind == _EXC:
            text = repr(value)
            new = self._on_str(text, depth, False)
            return value if new == text else new
        if depth >= self._max_depth:
            raise _PathError(f"value is nested deeper than max_depth={self._max_depth}")
        if kind == _MESSAGE and self._on_message is not None:
            # The callback caches per message object and calls walk_message on a miss.
            return self._on_message(value, depth + 1)
        key = id(value)
        if key in self._memo:
            return self._memo[key]
        if key in self._active:
            raise _PathError("cyclic reference: the value contains itself")
        self._active.add(key)
        try:
            result = self._walk_kind(kind, value, depth + 1)
        finally:
            self._active.discard(key)
        self._memo[key] = result
        return result

    def _walk_kind(self, kind: int, value: Any, depth: int) -> Any:
        if kind == _DICT:
            return self._walk_dict(value, depth)
        if kind == _LIST:
            return self._walk_list(value, depth)
        if kind == _TUPLE:
            return self._walk_tuple(value, depth)
        if kind == _SET:
            return self._walk_set(value, depth)
        if kind == _MESSAGE:
            return self.walk_message(value, depth)
        if kind == _PYDANTIC:
            return self._walk_pydantic(value, depth)
        if kind == _DATACLASS:
            return self._walk_dataclass(value, depth)
        if kind == _SEND:
            return self._walk_send(value, depth)
        return value

    # -- text in other types -----------------------------------------------------------------
    def _walk_str_subclass(self, value: str, depth: int) -> Any:
        text = str.__str__(value)
        new = self._on_str(text, depth, False)
        if new == text:
            return value
        import enum
        if not isinstance(value, enum.Enum):
            try:
                return type(value)(new)
            except Exception:  # noqa: BLE001 - a class that needs more than a string
                logger.debug("a %s could not be rebuilt from a string; stored as str",
                             type(value).__name__)
        return new

    def _walk_bytes(self, value: bytes | bytearray, depth: int) -> Any:
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return value  # binary data, not text
        new = self._on_str(text, depth, False)
        if new == text:
            return value
        data = new.encode("utf-8", "surrogatepass")
        return bytearray(data) if isinstance(value, bytearray) else type(value)(data) \
            if type(value) is not bytes else data

    # -- containers --------------------------------------------------------------------------
    def _walk_dict(self, value: dict[Any, Any], depth: int,
                   special: dict[str, Callable[[Any, int], Any]] | None = None
                   ) -> dict[Any, Any]:
        changed = False
        items: list[tuple[Any, Any]] = []
        outer = self.name
        for k, v in value.items():
            try:
                handler = special.get(k) if special and type(k) is str else None
                if handler is not None:
                    nk, nv = k, handler(v, depth)
                else:
                    if type(k) is str:
                        nk = self._on_str(k, depth, True)
                    elif self._on_number is not None and type(k) in _NUMBERS:
                        nk = self._on_number(k, outer)  # a card number can be a key too
                    else:
                        nk = k
                    self.name = k if type(k) is str else outer
                    nv = self._walk(v, depth)
                    self.name = outer
            except _PathError as exc:
                self.name = outer
                exc.path.append(_path_key(k))
                raise
            if nk is not k or nv is not v:
                changed = True
            items.append((nk, nv))
        if not changed:
            return value
        if type(value) is dict:
            out: dict[Any, Any] = {}
        else:
            out = copy.copy(value)
            out.clear()
        for nk, nv in items:
            if nk in out:
                raise _PathError(
                    "two dictionary keys become the same key once redacted; refusing to merge "
                    "them")
            out[nk] = nv
        return out

    def _walk_seq(self, value: Any, depth: int) -> tuple[list[Any], bool]:
        if (self._on_str_list is not None and len(value) >= STR_LIST_MIN
                and set(map(type, value)) == {str}):
            strings = value if isinstance(value, list) else list(value)
            results = self._on_str_list(strings, depth)
            if results is strings:
                return strings, False
            return list(results), any(map(operator.is_not, results, strings))
        changed = False
        out: list[Any] = []
        on_message = self._on_message if depth < self._max_depth else None
        kinds = _KINDS
        for i, v in enumerate(value):
            try:
                if on_message is not None and kinds.get(type(v)) == _MESSAGE:
                    nv = on_message(v, depth + 1)  # fast path: lists of messages
                else:
                    nv = self._walk(v, depth)
            except _PathError as exc:
                exc.path.append(f"[{i}]")
                raise
            if nv is not v:
                changed = True
            out.append(nv)
        return out, changed

    def _walk_list(self, value: list[Any], depth: int) -> list[Any]:
        if (self._on_message_list is not None and type(value) is list and value
                and depth < self._max_depth
                and all(_kind_of(t) == _MESSAGE for t in set(map(type, value)))):
            return self._on_message_list(value, depth)  # e.g. the "messages" channel
        out, changed = self._walk_seq(value, depth)
        if not changed:
            return value
        if type(value) is list:
            return out
        new = copy.copy(value)
        new[:] = out
        return new

    def _walk_tuple(self, value: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
        out, changed = self._walk_seq(value, depth)
        if not changed:
            return value
        if type(value) is tuple:
            return tuple(out)
        if hasattr(value, "_fields"):  # named tuple
            return type(value)(*out)
        return type(value)(out)

    def _walk_set(self, value: set[Any] | frozenset[Any], depth: int) -> Any:
        out, changed = self._walk_seq(list(value), depth)
        if not changed:
            return value
        return type(value)(out)

    # -- objects -----------------------------------------------------------------------------
    def _changed_attrs(self, value: Any, names: list[str], depth: int,
                       special: dict[str, Callable[[Any, int], Any]] | None = None
                       ) -> dict[str, Any]:
        """Walk the named attributes; return {name: new value} for those that changed."""
        changes: dict[str, Any] = {}
        outer = self.name
        for name in names:
            try:
                old = getattr(value, name)
            except AttributeError:
                continue
            handler = special.get(name) if special else None
            self.name = name
            try:
                new = handler(old, depth) if handler else self._walk(old, depth)
            except _PathError as exc:
                exc.path.append(f".{name}")
                raise
            finally:
                self.name = outer
            if new is not old:
                changes[name] = new
        return changes

    @staticmethod
    def _clone_with(value: Any, changes: dict[str, Any]) -> Any:
        clone = copy.copy(value)
        for name, new in changes.items():
            object.__setattr__(clone, name, new)
        return clone

    def _walk_pydantic(self, value: Any, depth: int) -> Any:
        names = list(type(value).model_fields)
        extra = getattr(value, "model_extra", None) or {}
        names.extend(k for k in extra if isinstance(k, str))
        changes = self._changed_attrs(value, names, depth)
        return value.model_copy(update=changes) if changes else value

    def _walk_dataclass(self, value: Any, depth: int) -> Any:
        names = [f.name for f in dataclasses.fields(value)]
        changes = self._changed_attrs(value, names, depth)
        return self._clone_with(value, changes) if changes else value

    def _walk_send(self, value: Any, depth: int) -> Any:
        changes = self._changed_attrs(value, ["arg"], depth)
        return self._clone_with(value, changes) if changes else value

    # -- LangChain messages ------------------------------------------------------------------
    def walk_message_guarded(self, msg: Any, depth: int) -> Any:
        """walk_message with cycle detection (for the on_message callback's cache misses)."""
        key = id(msg)
        if key in self._active:
            raise _PathError("cyclic reference: the value contains itself")
        self._active.add(key)
        try:
            return self.walk_message(msg, depth)
        finally:
            self._active.discard(key)

    def walk_message(self, msg: Any, depth: int) -> Any:
        """Redacted copy of one LangChain message (ids, types, names, tool_call ids kept)."""
        changes = self._changed_attrs(msg, _message_fields(type(msg)), depth,
                                      self._message_special)
        return msg.model_copy(update=changes) if changes else msg

    def _tool_calls_walker(self, keys: tuple[str, ...]) -> Callable[[Any, int], Any]:
        def walk_calls(calls: Any, depth: int) -> Any:
            if not isinstance(calls, list):
                return self._walk(calls, depth)
            return self._walk_list_of_dicts(calls, depth, keys)
        return walk_calls

    def _check_depth(self, depth: int) -> None:
        if depth >= self._max_depth:
            raise _PathError(f"value is nested deeper than max_depth={self._max_depth}")

    def _walk_list_of_dicts(self, calls: list[Any], depth: int, keys: tuple[str, ...],
                            nested: Callable[[Any, int], Any] | None = None) -> list[Any]:
        """Walk only ``keys`` of each dict in ``calls`` (ids, names, types stay verbatim)."""
        self._check_depth(depth + 1)
        out: list[Any] = []
        changed = False
        for i, call in enumerate(calls):
            if not isinstance(call, dict):
                new_call = self._walk(call, depth + 1)
            else:
                updates: dict[str, Any] = {}
                for k in keys:
                    if k not in call:
                        continue
                    old = call[k]
                    try:
                        new = nested(old, depth + 2) if nested else self._walk(old, depth + 2)
                    except _PathError as exc:
                        exc.path.append(f"[{i}][{k!r}]")
                        raise
                    if new is not old:
                        updates[k] = new
                new_call = {**call, **updates} if updates else call
            changed = changed or new_call is not call
            out.append(new_call)
        return out if changed else calls

    def _walk_function(self, fn: Any, depth: int) -> Any:
        """An OpenAI-style ``{"name": ..., "arguments": "<json>"}``: only arguments change."""
        if not isinstance(fn, dict):
            return self._walk(fn, depth)
        if "arguments" not in fn:
            return fn
        old = fn["arguments"]
        try:
            new = self._walk(old, depth + 1)
        except _PathError as exc:
            exc.path.append("['arguments']")
            raise
        return fn if new is old else {**fn, "arguments": new}

    def _walk_openai_tool_calls(self, calls: Any, depth: int) -> Any:
        if not isinstance(calls, list):
            return self._walk(calls, depth)
        return self._walk_list_of_dicts(calls, depth, ("function",), nested=self._walk_function)

    def _walk_additional_kwargs(self, kwargs: Any, depth: int) -> Any:
        if not isinstance(kwargs, dict):
            return self._walk(kwargs, depth)
        self._check_depth(depth)
        special: dict[str, Callable[[Any, int], Any]] = {
            "tool_calls": self._walk_openai_tool_calls,
            "function_call": self._walk_function,
        }
        return self._walk_dict(kwargs, depth + 1, special)


_FIELDS_BY_CLASS: dict[type, list[str]] = {}


def _message_fields(cls: type) -> list[str]:
    """The fields of a message class that are walked (identity fields excluded)."""
    names = _FIELDS_BY_CLASS.get(cls)
    if names is None:
        fields = getattr(cls, "model_fields", {})
        names = [n for n in fields if n not in MESSAGE_KEPT_FIELDS]
        _FIELDS_BY_CLASS[cls] = names
    return names
