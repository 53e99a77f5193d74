"""Per-turn latency of a compiled chat graph: SecureSaver vs the raw saver vs EncryptedSerializer.

All variants run in this one process, interleaved round by round, on the same machine and
database server, so the printed ratios compare like with like. Absolute times are noisy.
The targets apply to the wall-clock ratio; the CPU columns (this process's CPU time per turn,
all threads; the database server's is not counted) are printed beside it because on a
shared, overloaded machine the wall ratio drifts toward whatever the scheduler does.

    python benchmarks/saver_overhead.py [--turns 300] [--rounds 3] [--backends sqlite,postgres]
                                        [--provider keyring|kms|pkcs11]
                                        [--method interleaved|blocks]

``--method interleaved`` (the default) keeps one saver and one conversation per variant open
side by side and runs turn ``i`` of every variant before turn ``i + 1`` of any (the order
rotating from turn to turn), so a slow spell of the machine lands on all variants alike; the
ratios are medians over turns of each turn's time against the raw saver's same turn.
``--method blocks`` runs each variant's whole conversation in turn (the method of earlier
releases): drift on the machine lands on whichever variant is running then.

``--provider kms`` keys SecureSaver with an AwsKmsKeyProvider against moto's KMS server,
started on a loopback port by this script (needs the ``test`` extra). ``--provider pkcs11``
keys it with a Pkcs11KeyProvider on a SoftHSM2 token this script initialises in a temporary
directory (needs the ``pkcs11`` extra and the Debian package ``softhsm2``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.storage.backends import (
    connect_sqlite,
    libpq_url,
    postgres_connection_kwargs,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fake_agent import build_chat_graph

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _encrypted_serde():
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    return EncryptedSerializer.from_pycryptodome_aes(key=secrets.token_bytes(32))


@contextmanager
def sqlite_saver(variant: str, workdir: Path) -> Iterator[BaseCheckpointSaver]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    path = workdir / f"{variant}-{uuid.uuid4().hex}.db"
    if variant.startswith("securesaver"):
        redaction = shared_redactor() if variant == "securesaver_redaction" else None
        with SecureSaver.from_url(f"sqlite:///{path}", keyring=new_provider(),
                                  redaction=redaction) as saver:
            yield saver
        return
    conn = connect_sqlite(str(path))
    try:
        serde = _encrypted_serde() if variant == "encrypted_serializer" else None
        saver = SqliteSaver(conn, serde=serde)
        saver.setup()
        yield saver
    finally:
        conn.close()


@contextmanager
def postgres_saver(variant: str, workdir: Path) -> Iterator[BaseCheckpointSaver]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg_pool import ConnectionPool
    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    try:
        if variant.startswith("securesaver"):
            redaction = shared_redactor() if variant == "securesaver_redaction" else None
            with SecureSaver.from_url(url, keyring=new_provider(),
                                      redaction=redaction) as saver:
                yield saver
        else:
            with ConnectionPool(libpq_url(url), kwargs=postgres_connection_kwargs(), min_size=1, max_size=8) as pool:
                serde = _encrypted_serde() if variant == "encrypted_serializer" else None
                saver = PostgresSaver(pool, serde=serde)
                saver.setup()
                yield saver
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


_REDACTOR = None
_KMS_ALIAS: str | None = None
_PKCS11_URL: str | None = None


def new_provider():
    """The key provider of a SecureSaver variant: a fresh keyring, the KMS alias, or the
    PKCS#11 key."""
    if _PKCS11_URL is not None:
        from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
        return Pkcs11KeyProvider.from_url(_PKCS11_URL)
    if _KMS_ALIAS is None:
        return Keyring.generate()
    from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider
    return AwsKmsKeyProvider(_KMS_ALIAS)


@contextmanager
def kms_server() -> Iterator[None]:
    """moto's KMS server on a free loopback port, boto3 pointed at it, one key behind an alias."""
    global _KMS_ALIAS
    import logging
    import socket

    import boto3
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        kms = boto3.client("kms")
        key = kms.create_key()["KeyMetadata"]["KeyId"]
        kms.create_alias(AliasName="alias/securesaver-bench", TargetKeyId=key)
        _KMS_ALIAS = "alias/securesaver-bench"
        yield
    finally:
        _KMS_ALIAS = None
        server.stop()


@contextmanager
def softhsm_token() -> Iterator[None]:
    """A SoftHSM2 token in a temporary directory (``SOFTHSM2_CONF`` points at it) holding one
    AES key made by the provider."""
    global _PKCS11_URL
    import subprocess

    from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
    module = next(p for p in ("/usr/lib/softhsm/libsofthsm2.so",
                              "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
                  if os.path.exists(p))
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(f"{root}/tokens")
        Path(root, "softhsm2.conf").write_text(
            f"directories.tokendir = {root}/tokens\nobjectstore.backend = file\n"
            "log.level = ERROR\n")
        os.environ["SOFTHSM2_CONF"] = f"{root}/softhsm2.conf"
        os.environ["SECURESAVER_BENCH_PIN"] = pin = "pin-" + secrets.token_hex(8)
        subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", "bench",
                        "--pin", pin, "--so-pin", "so-" + pin], check=True,
                       capture_output=True)
        Pkcs11KeyProvider.create("bench", "bench-key", module=module,
                                 pin_env="SECURESAVER_BENCH_PIN")
        _PKCS11_URL = f"pkcs11://bench/bench-key?module={module}&pin-env=SECURESAVER_BENCH_PIN"
        try:
            yield
        finally:
            _PKCS11_URL = None


def shared_redactor():
    """One warmed-up redactor for the whole run (the engine is built once per process)."""
    global _REDACTOR
    if _REDACTOR is None:
        from langgraph_securesaver.redaction import Redactor
        _REDACTOR = Redactor()
        _REDACTOR.redact("warm up: a@example.com", token_key=b"k" * 32)
    return _REDACTOR


def turn_text(i: int) -> str:
    """Chat text; every fifth turn carries PII, as real support chats do."""
    if i % 5 == 4:
        return (f"turn {i}: my new email is user{i}@example.com and my phone is "
                f"+1 415 555 {1000 + i:04d}, please update the account")
    return f"turn {i}: please summarise the previous answer in one line"


def run_turns(saver: BaseCheckpointSaver, turns: int) -> list[float]:
    return run_turns_cpu(saver, turns)[0]


def run_turns_cpu(saver: BaseCheckpointSaver, turns: int) -> tuple[list[float], list[float]]:
    """(wall seconds, this process's CPU seconds, all threads) per turn."""
    graph = build_chat_graph(saver)
    config = {"configurable": {"thread_id": "bench", "tenant_id": "acme"}}
    times, cpu = [], []
    for i in range(turns):
        message = HumanMessage(turn_text(i))
        start, c0 = time.perf_counter(), time.process_time()
        graph.invoke({"messages": [message]}, config)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - c0)
    return times, cpu


VARIANTS = ("raw", "encrypted_serializer", "securesaver", "securesaver_redaction")
#: (backend, variant) -> the first turn of each round's new thread (cold: SecureSaver reads
#: or creates the thread's key row then), in seconds
FIRST_TURNS: dict[tuple[str, str], list[float]] = {}


def measure_interleaved(backend: str, factory: Callable, turns: int, rounds: int,
                        workdir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Per variant: the median over turns of (wall, client CPU) of each turn against the raw
    saver's same turn, in ms/turn scaled by the raw saver's median (so the printed ratios are
    the paired medians)."""
    from contextlib import ExitStack
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    wall_ratio: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu_ratio: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        with ExitStack() as stack:
            graphs = {v: build_chat_graph(stack.enter_context(factory(v, workdir)))
                      for v in VARIANTS}
            config = {"configurable": {"thread_id": "bench", "tenant_id": "acme"}}
            for i in range(turns):
                shift = i % len(VARIANTS)
                order = VARIANTS[shift:] + VARIANTS[:shift]
                this_wall, this_cpu = {}, {}
                for variant in order:
                    message = HumanMessage(turn_text(i))
                    start, c0 = time.perf_counter(), time.process_time()
                    graphs[variant].invoke({"messages": [message]}, config)
                    this_wall[variant] = time.perf_counter() - start
                    this_cpu[variant] = time.process_time() - c0
                if i == 0:
                    for variant in VARIANTS:
                        FIRST_TURNS.setdefault((backend, variant), []).append(this_wall[variant])
                    continue
                for variant in VARIANTS:
                    wall[variant].append(this_wall[variant])
                    cpu[variant].append(this_cpu[variant])
                    wall_ratio[variant].append(this_wall[variant] / this_wall["raw"])
                    cpu_ratio[variant].append(this_cpu[variant] / max(this_cpu["raw"], 1e-6))
    raw_wall = statistics.median(wall["raw"]) * 1000
    raw_cpu = statistics.median(cpu["raw"]) * 1000
    return ({v: raw_wall * statistics.median(r) for v, r in wall_ratio.items()},
            {v: raw_cpu * statistics.median(r) for v, r in cpu_ratio.items()})


def measure(backend: str, factory: Callable, turns: int, rounds: int, workdir: Path
            ) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms/turn per variant, each variant's conversation run as one block: (wall,
    client CPU)."""
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            with factory(variant, workdir) as saver:
                w, c = run_turns_cpu(saver, turns)
                FIRST_TURNS.setdefault((backend, variant), []).append(w[0])
                wall[variant].append(statistics.median(w))
                cpu[variant].append(statistics.median(c))
    return ({v: statistics.median(ts) * 1000 for v, ts in wall.items()},
            {v: statistics.median(ts) * 1000 for v, ts in cpu.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--provider", choices=("keyring", "kms", "pkcs11"), default="keyring")
    parser.add_argument("--method", choices=("interleaved", "blocks"), default="interleaved")
    args = parser.parse_args()
    if args.provider == "kms":
        with kms_server():
            return run(args)
    if args.provider == "pkcs11":
        with softhsm_token():
            return run(args)
    return run(args)


def run(args: argparse.Namespace) -> int:
    factories = {"sqlite": sqlite_saver, "postgres": postgres_saver}
    targets = {"sqlite": 1.10, "postgres": 1.10}  # encryption only (issue 9)
    full_stack_targets = {"sqlite": 1.5, "postgres": 1.5}  # with redaction (issues 9, 10)
    print(f"per-turn median latency, one-node chat graph, {args.turns} turns x {args.rounds} rounds"
          f", key provider {args.provider}, method {args.method}"
          f"; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'backend':<10}{'variant':<24}{'ms/turn':>9}{'x raw':>8}{'CPU ms':>9}{'x raw':>8}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            how = measure_interleaved if args.method == "interleaved" else measure
            results, cpu = how(backend, factories[backend], args.turns, args.rounds, Path(tmp))
            raw = results["raw"]
            for variant, ms in results.items():
                print(f"{backend:<10}{variant:<24}{ms:>9.2f}{ms / raw:>8.2f}"
                      f"{cpu[variant]:>9.2f}{cpu[variant] / cpu['raw']:>8.2f}")
            firsts = {v: statistics.median(FIRST_TURNS[(backend, v)]) * 1000 for v in VARIANTS}
            print(f"{backend:<10}{'first turn (cold)':<24}" + "  ".join(
                f"{v} {ms:.2f} ms ({ms / firsts['raw']:.2f}x)" for v, ms in firsts.items()))
            ratio = results["securesaver"] / raw
            verdict = "ok" if ratio <= targets[backend] else "ABOVE TARGET"
            print(f"{backend:<10}{'securesaver target':<24}{'<=':>9}{targets[backend]:>8.2f}"
                  f"  {verdict}")
            ok = ok and ratio <= targets[backend]
            if backend in full_stack_targets:
                full = results["securesaver_redaction"] / raw
                verdict = "ok" if full <= full_stack_targets[backend] else "ABOVE TARGET"
                print(f"{backend:<10}{'+redaction target':<24}{'<=':>9}"
                      f"{full_stack_targets[backend]:>8.2f}  {verdict}")
                ok = ok and full <= full_stack_targets[backend]
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
