"""Shared helpers for tests that run the compiled demo graph and read raw storage."""

from __future__ import annotations

import struct
from pathlib import Path

MARKERS = {
    "message": "MSG-MARKER-7f3a91",
    "tool_arg": "TOOLARG-MARKER-55c2",
    "email": "leak.marker.b7@example.org",
    "configurable": "CFG-MARKER-d41d8",
    "metadata": "META-MARKER-0e2f",
    "write": "WRITE-MARKER-a9e1",
}
INT_MARKER = 913_572_468  # an int channel value with a distinctive encoding


def marker_needles() -> dict[str, list[bytes]]:
    """Every encoding in which a marker could sit in a raw file or a text dump."""
    needles: dict[str, list[bytes]] = {}
    for name, text in MARKERS.items():
        raw = text.encode()
        needles[name] = [raw, raw.hex().encode(), text.encode("utf-16-le")]
    packed = struct.pack(">I", INT_MARKER)
    needles["int"] = [str(INT_MARKER).encode(), packed, packed.hex().encode()]
    return needles


def found_markers(blob: bytes) -> list[str]:
    return [name for name, forms in marker_needles().items() if any(f in blob for f in forms)]


def sqlite_files_bytes(db_path: Path) -> bytes:
    data = b""
    for f in db_path.parent.iterdir():
        if f.name.startswith(db_path.name):
            data += f.read_bytes()
    return data


def turns() -> list[str]:
    m = MARKERS
    return [
        f"Hello, my note is {m['message']} and my email is {m['email']}",
        f"Where is order {m['tool_arg']}?",
        "thanks, that is all",
    ]
