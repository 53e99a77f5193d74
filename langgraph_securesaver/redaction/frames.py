"""The frames between the redactor and its worker processes: a 4-byte length, then JSON.

JSON, not pickle: what a worker sends back is parsed, never evaluated.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


def read_frame(stream: IO[bytes]) -> Any:
    """The next JSON frame, or None at end of stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    body = stream.read(size)
    if len(body) < size:
        return None
    return json.loads(body.decode("utf-8"))


def write_frame(stream: IO[bytes], doc: Any) -> None:
    body = json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()
