"""The HTML audit report is self-contained and its charts render in headless Chromium.

Needs the ``chromium`` binary (Debian: ``apt-get install -y chromium``). Without it the
screenshot test is skipped with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.audit.report_html import PALETTE
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app
from tests.fake_agent import build_chat_graph

runner = CliRunner()
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _rgb(color: str) -> tuple[int, int, int]:
    return (int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16))


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """acme holds about twice as much as globex; one globex thread is past its expiry."""
    tmp = tmp_path_factory.mktemp("html")
    url = f"sqlite:///{tmp / 'agent.db'}"
    ring = Keyring.generate()
    ring_file = ring.save(tmp / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        graph = build_chat_graph(saver)
        for tenant, threads in (("acme", 7), ("globex", 3)):
            for i in range(threads):
                for turn in range(3):
                    graph.invoke({"messages": [HumanMessage(f"{tenant} {i} turn {turn}")]},
                                 {"configurable": {"thread_id": f"{tenant}-{i}",
                                                   "tenant_id": tenant}})
        with tenant_scope("globex"):
            saver.set_retention("globex-0", idle_ttl=0.001)
            with pytest.raises(PermissionError):      # a cross-tenant attempt, recorded
                saver.get_tuple({"configurable": {"thread_id": "acme-1", "tenant_id": "acme"}})
        with tenant_scope("acme"):
            saver.delete_thread("acme-5")             # an erasure, with its receipt
    out = tmp / "report.html"
    result = runner.invoke(app, ["audit", "--url", url, "--format", "html", "--out", str(out),
                                 "--keyring", str(ring_file)])
    assert result.exit_code == 1, result.output   # globex-0 is past its expiry
    return out


def test_report_is_self_contained_with_both_charts(report_html: Path) -> None:
    text = report_html.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    for external in ("<script", "src=", "href=", "url(", "@import", "http:", "https:", "<link"):
        assert external not in text, f"report references something outside itself: {external}"
    assert text.count("<svg") == 2
    assert 'id="chart-age"' in text and 'id="chart-tenant"' in text
    age = text.split('id="chart-age"')[1].split("</svg>")[0]
    assert f'fill="{PALETTE[0]}"' in age and f'fill="{PALETTE[1]}"' in age   # stacked tenants
    assert "past expiry" in text and "globex-0" in text


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """A minimal PNG decoder (8-bit RGB/RGBA, not interlaced): width, height, pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color_type, _c, _f, interlace = header
    assert depth == 8 and color_type in (2, 6) and interlace == 0, header
    channels = 4 if color_type == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    at = 0
    for _ in range(height):
        kind, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        pixels.extend(tuple(line[i:i + 3]) for i in range(0, stride, channels))
        previous = line
    return width, height, pixels


def test_report_charts_render_in_headless_chromium(report_html: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        reason = ("chromium is not installed (Debian: apt-get install -y chromium); the HTML "
                  "report screenshot test needs it")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires it: {reason}")
        pytest.skip(reason)
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", "--window-size=1280,1600", report_html.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    keep = os.environ.get("SECURESAVER_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
    width, height, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    counts = Counter(pixels)
    acme, globex = counts[_rgb(PALETTE[0])], counts[_rgb(PALETTE[1])]
    # both charts draw both tenants as solid bars (legend swatches alone are ~200 pixels)
    assert acme > 5000 and globex > 2500, (acme, globex)
    assert acme > globex          # acme holds more, so its bars are bigger
    assert len(counts) > 50       # text and table rendered too, not a blank page
    assert re.search(r"\d", report_html.read_text())


# --- what an auditor needs, at 420 px and 1280 px --------------------------------------------
def test_report_states_what_an_auditor_signs(report_html: Path) -> None:
    """Database identity and backend, generation time, library version, what was verified
    and how (with counts), the erasure and the refused read made before the report, a
    legend, a print stylesheet and a phone layout."""
    from langgraph_securesaver import __version__
    text = report_html.read_text(encoding="utf-8")
    about = text.split("About this report", 1)[1].split("</dl>", 1)[0]
    assert re.search(r"<dt>database id</dt><dd>[0-9a-f]{32}</dd>", about), about
    assert "<dt>backend</dt><dd>sqlite</dd>" in about and "agent.db" in about
    assert f"langgraph-securesaver {__version__}" in about and " UTC" in about
    checkpoints = text.split('id="verify-checkpoints"', 1)[1].split("</div>", 1)[0]
    assert "Checkpoints at rest: pass" in checkpoints
    assert re.search(r"([\d,]+) ciphertexts found, \1 authenticated", checkpoints), checkpoints
    registry = text.split('id="verify-registry"', 1)[1].split("</div>", 1)[0]
    assert "Registry integrity: pass" in registry and re.search(r"[1-9][\d,]* rows checked",
                                                                  registry)
    receipts = text.split('id="receipts"', 1)[1].split("</table>", 1)[0]
    assert "receipt:deleted" in receipts and "acme-5" in receipts and "delete_thread" in receipts
    denials = text.split('id="denials"', 1)[1].split("</table>", 1)[0]
    assert "access_denied" in denials and "acme-1" in denials and "globex" in denials
    assert 'id="legend"' in text and "deletion receipt" in text.split('id="legend"')[1]
    assert "@media print" in text and "@media (max-width:640px)" in text
    assert 'name="viewport"' in text and 'data-label="thread"' in text


def test_report_without_a_keyring_says_it_was_not_verified(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]},
                                       {"configurable": {"thread_id": "t", "tenant_id": "a"}})
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["audit", "--url", url, "--format", "html", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "Not verified." in text and "without the keyring" in text
    assert 'id="verify-checkpoints"' not in text


def _screenshot(report: Path, tmp_path: Path, width: int, height: int) -> Path:
    browser = _chromium()
    if browser is None:
        reason = ("chromium is not installed (Debian: apt-get install -y chromium); the HTML "
                  "report screenshot test needs it")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires it: {reason}")
        pytest.skip(reason)
    shot = tmp_path / f"report-{width}.png"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", f"--user-data-dir={tmp_path / f'profile-{width}'}",
         f"--screenshot={shot}", f"--window-size={width},{height}", report.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    keep = os.environ.get("SECURESAVER_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, f"{keep}-{width}.png")
    return shot


@pytest.mark.parametrize("width", [420, 1280])
def test_report_is_readable_at_phone_and_desktop_width(report_html: Path, tmp_path: Path,
                                                       width: int) -> None:
    """Both charts draw both tenants within the viewport, and nothing is pushed past its
    right edge: the rightmost columns of the page stay background (a wide table or chart
    that overflowed would paint there)."""
    w, h, pixels = decode_png(_screenshot(report_html, tmp_path, width, 3000).read_bytes())
    assert (w, h) == (width, 3000)
    counts = Counter(pixels)
    acme, globex = counts[_rgb(PALETTE[0])], counts[_rgb(PALETTE[1])]
    assert acme > globex > 300, (acme, globex)
    margin = [pixels[y * w + x] for y in range(h) for x in range(w - 6, w)]
    painted = sum(1 for p in margin if p != (255, 255, 255))
    assert painted < len(margin) * 0.01, painted


def test_the_report_reads_the_latest_of_a_long_trail_and_counts_the_rest(
        tmp_path: Path) -> None:
    """A period with more receipts and refused reads than the page shows: the report reads
    their count and the latest ones only (a million-thread trail must not be held in memory),
    the same entries, in the same order, as the full trail's tail."""
    from langgraph_securesaver.audit.report_html import ReportContext, _trail
    from langgraph_securesaver.audit.trail import events, latest
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'trail.db'}",
                              keyring=Keyring.generate()) as saver:
        graph = build_chat_graph(saver)
        for i in range(12):
            cfg = {"configurable": {"thread_id": f"t{i}", "tenant_id": "acme"}}
            graph.invoke({"messages": [HumanMessage("hello")]}, cfg)
        # deleted after all were written: each deletion waits out the lease fence of its
        # thread's last write (5 s), and these waits then overlap instead of adding up
        for i in range(12):
            with tenant_scope("acme"):
                saver.delete_thread(f"t{i}")
        for i in range(9):
            saver.registry.record_event("access_denied", tenant="acme", thread_id=f"x{i}",
                                        actor="globex", operation="get_tuple")
        everything = events(saver)
        for receipts, wanted in ((True, [e for e in everything if e.source == "receipt"]),
                                 (False, [e for e in everything if e.kind == "access_denied"])):
            total, shown = latest(saver, receipts=receipts, n=5)
            assert total == len(wanted) and shown == wanted[-5:], receipts
            assert latest(saver, receipts=receipts, tenant="globex", n=5) == (0, [])
        total, shown = latest(saver, receipts=True, n=5)
        page = "".join(_trail("Deletion receipts", "receipts", shown, "none", total))
        assert "Deletion receipts (12)" in page and "The latest 5 of 12" in page
        assert ReportContext().receipts_total is None   # a context built by hand: len() counts
