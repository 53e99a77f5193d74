"""What the LangGraph Server encryption handlers cost per run: runs/s with and without them.

Two real ``langgraph dev`` servers on loopback ports, both on examples/langgraph_server
(SecureSaver checkpointer, SecureStore, the example's auth), one with the ``encryption`` entry
and one without. Rounds alternate between them; each round makes ``--runs`` sequential
``runs.wait`` calls on one thread per variant (the example agent: a tool call, three model
steps), as one authenticated user. Printed: runs/s per variant (median over rounds) and the
ratio. Then the handlers alone: encrypt + decrypt of a run's kwargs (the input message,
config, metadata), per call, redaction on and off.

    python benchmarks/server_encryption.py [--runs 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "langgraph_server"
ALICE = {"Authorization": "Bearer token-alice"}
TEXT = "Hi, this is alice.w@example.com about order ACME-7781, it never arrived"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(workdir: Path, encrypted: bool) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    from langgraph_securesaver import Keyring
    shutil.copytree(EXAMPLE, workdir, dirs_exist_ok=True)
    config = json.loads((workdir / "langgraph.json").read_text(encoding="utf-8"))
    if not encrypted:
        config.pop("encryption", None)
        config.pop("env", None)
    (workdir / "langgraph.json").write_text(json.dumps(config), encoding="utf-8")
    Keyring.generate().save(workdir / "keyring.json")
    port = _port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("SECURESAVER_MASTER_KEY", "LANGGRAPH_ENCRYPTION")}
    env.update({"SECURESAVER_URL": f"sqlite:///{workdir / 'checkpoints.db'}",
                "SECURESAVER_KEYRING_FILE": str(workdir / "keyring.json"),
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
                "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false"})
    exe = Path(sys.executable).with_name("langgraph")
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen([str(exe), "dev", "--host", "127.0.0.1", "--port", str(port),
                             "--no-browser", "--no-reload", "--config", "langgraph.json"],
                            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit((workdir / "server.log").read_text(errors="replace")[-3000:])
        try:
            if httpx.get(url + "/ok", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the server did not start")


async def runs_per_second(url: str, n: int) -> float:
    from langgraph_sdk import get_client
    client = get_client(url=url, headers=ALICE)
    tid = (await client.threads.create(metadata={"topic": "benchmark"}))["thread_id"]
    await client.runs.wait(tid, "agent", input={"messages": [{"role": "user", "content": TEXT}]})
    started = time.perf_counter()
    for i in range(n):
        await client.runs.wait(tid, "agent", input={"messages": [
            {"role": "user", "content": f"{TEXT} (message {i})"}]},
            metadata={"note": f"run {i}"})
    return n / (time.perf_counter() - started)


async def handler_cost(redaction: bool, calls: int, workdir: Path) -> float:
    """Microseconds per encrypt + decrypt of one run's kwargs fields."""
    from langgraph_sdk import EncryptionContext

    from langgraph_securesaver import Keyring
    from langgraph_securesaver.server.encryption import ServerEncryption
    from langgraph_securesaver.server.saver import ServerSettings
    settings = ServerSettings(url=f"sqlite:///{workdir / f'h{redaction}.db'}",
                              keyring=Keyring.generate(), redaction=redaction)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = ServerEncryption(settings=settings)
    encrypt, decrypt = enc.sdk.get_json_encryptor(), enc.sdk.get_json_decryptor()
    fields = [{"messages": [{"role": "user", "content": TEXT}]},
              {"configurable": {"langgraph_auth_user": {"identity": "alice"}, "x": 1}},
              {"note": "run", "owner": "alice"}]

    def ctx() -> Any:
        return EncryptionContext(model="run", metadata={"securesaver_tenant": "alice"})

    for data in fields:   # warm: keys, redactor
        await decrypt(ctx(), await encrypt(ctx(), data))
    started = time.perf_counter()
    for i in range(calls):
        data = {**fields[i % 3]}
        await decrypt(ctx(), await encrypt(ctx(), data))
    enc.close()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        servers = {name: start(Path(tmp) / name, name == "encrypted")
                   for name in ("plain", "encrypted")}
        rates: dict[str, list[float]] = {name: [] for name in servers}
        try:
            for _ in range(args.rounds):
                for name, (_proc, url) in servers.items():
                    rates[name].append(asyncio.run(runs_per_second(url, args.runs)))
        finally:
            for proc, _url in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
        plain, encrypted = (statistics.median(rates[n]) for n in ("plain", "encrypted"))
        print(f"runs/s without encryption: {plain:.2f}  (rounds: "
              + ", ".join(f"{r:.2f}" for r in rates["plain"]) + ")")
        print(f"runs/s with encryption:    {encrypted:.2f}  (rounds: "
              + ", ".join(f"{r:.2f}" for r in rates["encrypted"]) + ")")
        print(f"ratio (with / without):    {encrypted / plain:.3f}")
        for redaction in (False, True):
            cost = asyncio.run(handler_cost(redaction, args.calls, Path(tmp)))
            print(f"handlers, encrypt+decrypt per field, redaction "
                  f"{'on ' if redaction else 'off'}: {cost:.0f} us")
        print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
