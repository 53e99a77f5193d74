"""What SecureStore evaluates itself, on authenticated values: value filters, namespace match
conditions, and vector scores (the inner store only ever sees ciphertext and keyed digests).

The filter semantics are LangGraph's (``InMemoryStore``/``PostgresStore``): a field equals a
scalar, nested mappings match field by field, lists element by element, and the comparison
operators ``$eq $ne $gt $gte $lt $lte``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.store.base import MatchCondition
from langgraph.store.base.embed import get_text_at_path, tokenize_path

_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


def _apply(value: Any, operator: str, wanted: Any) -> bool:
    if operator == "$eq":
        return bool(value == wanted)
    if operator == "$ne":
        return bool(value != wanted)
    if operator not in _OPERATORS:
        raise ValueError(f"Unsupported operator: {operator}")
    try:
        left, right = float(value), float(wanted)
    except (TypeError, ValueError):
        return False
    if operator == "$gt":
        return left > right
    if operator == "$gte":
        return left >= right
    if operator == "$lt":
        return left < right
    return left <= right


def field_matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_apply(value, op, arg) for op, arg in wanted.items())
        return isinstance(value, Mapping) and all(
            field_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(wanted)
                and all(field_matches(a, b) for a, b in zip(value, wanted, strict=True)))
    return bool(value == wanted)


def _field(value: Mapping[str, Any], key: str, dotted: bool) -> Any:
    if not dotted or "." not in key:
        return value.get(key)
    node: Any = value
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def value_matches(value: Any, filter: Mapping[str, Any] | None, dotted: bool = False) -> bool:
    """Whether ``value`` passes ``filter``; ``dotted``: a key ``a.b`` is the path a -> b (the
    SQLite stores' convention), else a literal key (the in-memory and PostgreSQL stores')."""
    if not filter:
        return True
    if not isinstance(value, Mapping):
        return False
    return all(field_matches(_field(value, k, dotted), v) for k, v in filter.items())


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"Unsupported match type: {condition.match_type}")
    return all(p == "*" or n == p for n, p in pairs)


# embeddings -------------------------------------------------------------------------------
def index_paths(config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The (path, tokenized path) pairs an index configuration embeds by default."""
    fields = config.get("fields") or config.get("text_fields") or ["$"]
    if isinstance(fields, str):
        fields = [fields]
    return [(p, p if p == "$" else tokenize_path(p)) for p in fields]


def texts_to_embed(value: Any, paths: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(vector name, text) pairs of one value, named as LangGraph's stores name them."""
    out: list[tuple[str, str]] = []
    for path, tokens in paths:
        texts = get_text_at_path(value, tokens)
        if len(texts) == 1:
            out.append((path, texts[0]))
        else:
            out.extend((f"{path}.{i}", text) for i, text in enumerate(texts))
    return out


def score(query: Sequence[float], vector: Sequence[float], distance: str) -> float:
    """Higher is closer: cosine similarity, inner product, or negative L2 distance."""
    if len(query) != len(vector):
        return float("-inf")
    dot = math.fsum(a * b for a, b in zip(query, vector, strict=True))
    if distance == "inner_product":
        return dot
    if distance == "l2":
        return -math.sqrt(math.fsum((a - b) ** 2 for a, b in zip(query, vector, strict=True)))
    norm = math.sqrt(math.fsum(a * a for a in query)) * math.sqrt(
        math.fsum(b * b for b in vector))
    return dot / norm if norm else 0.0
