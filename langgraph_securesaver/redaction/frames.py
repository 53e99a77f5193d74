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
    """The next JSON frame, or None at end of stream. ``stream`` may be unbuffered (a read
    then returns what the pipe holds, possibly less than asked)."""
    head = _read_exact(stream, HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    body = _read_exact(stream, size)
    if len(body) < size:
        return None
    return json.loads(body.decode("utf-8"))


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    """``size`` bytes, or fewer at end of stream."""
    data = stream.read(size)
    if data is None or len(data) >= size:
        return data or b""
    parts = [data]
    got = len(data)
    while got < size:
        chunk = stream.read(size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def write_frame(stream: IO[bytes], doc: Any) -> None:
    body = json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()
