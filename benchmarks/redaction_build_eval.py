"""Build the third-party evaluation sets: ``benchmarks/data/independent_eval.jsonl`` and
``benchmarks/data/independent_holdout.jsonl`` (committed), and optionally
``benchmarks/data/upstream_eval.jsonl`` (never committed; built locally, see below).

Sources (each row says which in ``source``):

* ``faker:<locale>`` — values from Faker (en_US, en_GB, zh_CN, de_DE, fr_FR, ja_JP providers:
  e-mails, phone numbers, card numbers of every issuer Faker knows, SSNs, IBANs, IPv4/IPv6,
  PRC resident IDs, Chinese mobiles) placed in sentences of many styles (chat in English and
  Chinese, JSON, logs, code, CSV, YAML, Markdown, URLs, e-mail headers).
* ``hand:negative`` — hard negatives written here: versions, build numbers, order/invoice
  numbers, ids, hashes, timestamps, prices, code constants, git remotes, user agents, OIDs.

Those two make ``independent_eval.jsonl``. Faker output and the negatives are seeded, so the
committed files are reproducible.

Only with ``--presidio PATH --detect-secrets PATH`` (local git clones of microsoft/presidio and
Yelp/detect-secrets; the files are read with ``git show HEAD:<path>``), the upstream-derived
rows go to ``upstream_eval.jsonl``, which is git-ignored — the project does not ship the
upstream test vectors:

* ``presidio:<test file>`` — the input strings and expected spans of presidio-analyzer's own
  recognizer unit tests (e-mail, credit card, IP, IBAN, crypto, US SSN, phone); rows upstream
  expects no match for are hard negatives. Phone rows in local formats of regions the
  default engine does not claim (Israel, Japan, India without ``+``) are ``out_of_scope``.
* ``detect-secrets:<plugin test>`` — the payloads of Yelp/detect-secrets' plugin tests; the
  ones upstream flags are positives (gold = the credential), a curated few of the unflagged
  ones are hard negatives (unflagged lines that still hold a credential are left out).

The script only reads string literals out of the test files' parameter lists.

The recognizers were tuned after a first look at the misses on the independent rows and the
upstream rows (then in one file); ``independent_holdout.jsonl`` (new Faker values and new
random negatives from other seeds) was generated afterwards and not tuned on.

Usage: python benchmarks/redaction_build_eval.py [--presidio PATH --detect-secrets PATH]
"""

# ruff: noqa: RUF001 - the Chinese sentence templates use full-width punctuation on purpose
from __future__ import annotations

import argparse
import ast
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "independent_eval.jsonl"
HOLDOUT = Path(__file__).parent / "data" / "independent_holdout.jsonl"
UPSTREAM = Path(__file__).parent / "data" / "upstream_eval.jsonl"  # git-ignored, never shipped

PRESIDIO_TESTS = {
    "test_email_recognizer.py": "EMAIL_ADDRESS",
    "test_credit_card_recognizer.py": "CREDIT_CARD",
    "test_ip_recognizer.py": "IP_ADDRESS",
    "test_iban_recognizer.py": "IBAN_CODE",
    "test_crypto_recognizer.py": "CRYPTO",
    "test_us_ssn_recognizer.py": "US_SSN",
    "test_phone_recognizer.py": "PHONE_NUMBER",
}
# local formats of regions the default engine does not claim (no "+", not US/GB/CN)
OUT_OF_SCOPE_PHONES = ("09-7625400", "090-1234-5678", "91-415-555-0132", "415-555-0132 ")


def git_show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def literal_tuples(source: str) -> list[tuple[Any, ...]]:
    """Every tuple literal in ``source`` whose elements are all literals."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple):
            try:
                value = ast.literal_eval(node)
            except ValueError:
                continue
            out.append(value)
    return out


def _spans(value: Any) -> list[tuple[int, int]] | None:
    if (isinstance(value, tuple) and value and all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(i, int) for i in p)
            for p in value)):
        return list(value)
    return None


def _max_scores(tup: tuple[Any, ...]) -> list[float] | None:
    """The highest score upstream expects for each entity, if the tuple states score ranges."""
    for item in tup[2:]:
        if (isinstance(item, tuple) and item and all(
                isinstance(p, tuple) and len(p) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
                and any(isinstance(x, float) for x in p) for p in item)):
            return [float(p[1]) for p in item]
    return None


# Upstream negatives for one recognizer that hold another kind's PII (not hard negatives here)
NOT_NEGATIVE = ("440-600-5124",)


def presidio_rows(repo: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name, kind in PRESIDIO_TESTS.items():
        src = git_show(repo, f"presidio-analyzer/tests/{name}")
        for tup in literal_tuples(src):
            if len(tup) < 2 or not isinstance(tup[0], str) or not isinstance(tup[1], int):
                continue
            if name == "test_phone_recognizer.py" and len(tup) == 6:
                continue  # leniency tests: only some of the row's phone numbers are labelled
            text, expected = tup[0], tup[1]
            if not text.strip() or text in seen:
                continue
            spans = next((s for s in map(_spans, tup[2:]) if s), None)
            if expected and (spans is None or len(spans) != expected):
                if expected == 1 and spans is None:  # the whole text is the entity
                    spans = [(0, len(text))]
                else:
                    continue
            seen.add(text)
            source = f"presidio:{name}"
            if expected == 0:
                if any(p in text for p in NOT_NEGATIVE):
                    continue
                rows.append({"text": text, "entities": [], "category": "hard_negative:upstream",
                             "source": source})
                continue
            assert spans is not None
            tops = _max_scores(tup)
            if tops is not None and len(tops) == len(spans):
                # entities upstream itself scores below any usable threshold are not gold
                strong = [sp for sp, top in zip(spans, tops, strict=True) if top >= 0.4]
            else:
                strong = spans
            ents = [{"kind": kind, "value": text[s:e]} for s, e in (strong or spans)]
            category = f"positive:{kind.lower()}" if strong else "weak_upstream"
            if kind == "PHONE_NUMBER" and any(p in text for p in OUT_OF_SCOPE_PHONES):
                category = "out_of_scope:phone_region"
            rows.append({"text": text, "entities": ents, "category": category,
                         "source": source})
    return rows


# detect-secrets plugin tests: (file, how to find the credential in a flagged payload)
DS_TESTS = ["aws_key_test.py", "github_token_test.py", "gitlab_token_test.py", "jwt_test.py",
            "npm_test.py", "sendgrid_test.py", "telegram_token_test.py", "openai_test.py",
            "azure_storage_key_test.py", "basic_auth_test.py", "stripe_key_test.py",
            "slack_test.py", "private_key_test.py", "discord_test.py", "pypi_token_test.py"]
DS_NEGATIVES = {"foo", "jwt", "akiazzzzzzzzzzzzzzzz", "AKIAZZZ", "eyJAAAA.eyJBBB",
                "eyJBB.eyJCC.eyJDDDD", "//registry.npmjs.org/:_authToken=${NPM_TOKEN}",
                "http://localhost:5000/<%= @variable %>", "https://url:8000 @something else",
                "https://url:8000/ @something else", "foo-hello-world80_testin",
                "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
                "bm90X3ZhbGlkX2pzb25fYXRfYWxs.bm90X3ZhbGlkX2pzb25fYXRfYWxs."
                "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"}


def _credential(payload: str) -> str:
    """The credential in a flagged detect-secrets payload (the part after a label)."""
    if payload.startswith("-----BEGIN"):
        return payload
    if "://" in payload and "@" in payload:  # scheme://user:password@host
        return payload.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    for sep in ("_authToken=", "AccountKey=", " = ", "=", ": "):
        if sep in payload:
            return payload.rsplit(sep, 1)[1].strip().strip("\"'")
    return payload


def detect_secrets_rows(repo: Path) -> list[dict[str, Any]]:
    rows = []
    seen: set[str] = set()
    aws_example = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    for name in DS_TESTS:
        try:
            src = git_show(repo, f"tests/plugins/{name}")
        except subprocess.CalledProcessError:
            continue
        src = src.replace("'aws_access_key = \"{}\"'.format(EXAMPLE_SECRET)",
                          f"'aws_access_key = \"{aws_example}\"'")
        for tup in literal_tuples(src):
            if len(tup) == 2 and isinstance(tup[0], str) and isinstance(tup[1], bool):
                payload, flagged = tup
            elif len(tup) == 1 and isinstance(tup[0], str) and name == "slack_test.py":
                payload, flagged = tup[0], True
            elif (len(tup) == 1 and isinstance(tup[0], str) and name == "private_key_test.py"
                  and "BEGIN" in tup[0]):
                payload, flagged = tup[0], True
            else:
                continue
            if payload in seen:
                continue
            seen.add(payload)
            source = f"detect-secrets:{name}"
            if flagged:
                value = _credential(payload)
                if name == "discord_test.py":  # the token: the longest run of token chars
                    value = max(re.findall(r"[A-Za-z0-9_.\-]+", payload), key=len)
                if name == "private_key_test.py":
                    value = payload[payload.index("-----BEGIN"):]
                rows.append({"text": payload, "entities": [{"kind": "API_SECRET",
                                                            "value": value}],
                             "category": "positive:api_secret", "source": source})
            elif payload in DS_NEGATIVES:
                rows.append({"text": payload, "entities": [],
                             "category": "hard_negative:upstream", "source": source})
    return rows


# ---------------------------------------------------------------------------------------------
# Faker values in sentences of many styles
# ---------------------------------------------------------------------------------------------
EN_STYLES = [
    "please contact me at {v} tomorrow",
    "My {label} is {v}, thanks!",
    '{{"user": {{"{key}": "{v}", "verified": true}}}}',
    "2024-03-01T10:22:31Z INFO request from user {key}={v} status=200",
    "{key} = \"{v}\"  # TODO move to vault",
    "name,{key},city\nJohn Smith,{v},Springfield",
    "{key}: {v}\nrole: admin",
    "| field | value |\n|---|---|\n| {label} | {v} |",
    "Hi team,\n\nThe customer's {label} is {v}. Can someone follow up?\n\nBest",
    "<td>{v}</td>",
    "ERROR: could not verify {label} '{v}' for account",
    "{v}",
    "Sure - {v} is the one on file.",
]
ZH_STYLES = [
    "我的{zlabel}是{v}，请尽快处理",
    "客户{zlabel}：{v}（已核实）",
    "请把{v}加到白名单里",
    "{zlabel}{v}，谢谢",
    '{{"客户": {{"{key}": "{v}"}}}}',
    "用户反馈：登录时用的{zlabel}是 {v} 。",
]
LABELS = {
    "EMAIL_ADDRESS": ("email", "email", "邮箱"),
    "PHONE_NUMBER": ("phone number", "phone", "电话"),
    "CN_MOBILE": ("mobile", "mobile", "手机号"),
    "CREDIT_CARD": ("card number", "card_number", "卡号"),
    "US_SSN": ("SSN", "ssn", "社会安全号"),
    "IBAN_CODE": ("IBAN", "iban", "银行账号"),
    "IP_ADDRESS": ("IP address", "client_ip", "IP地址"),
    "CN_RESIDENT_ID": ("ID number", "id_card", "身份证号"),
}


_IBAN_LENGTHS = {"DE": 22, "FR": 27, "GB": 22, "JP": 0, "CN": 0, "US": 0}


def _iban_ok(iban: str) -> bool:
    compact = iban.replace(" ", "")
    if _IBAN_LENGTHS.get(compact[:2], len(compact)) != len(compact):
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _faker_values(seed: int) -> list[tuple[str, str, str]]:
    from faker import Faker

    out: list[tuple[str, str, str]] = []
    fakers = {loc: Faker(loc) for loc in ("en_US", "en_GB", "zh_CN", "de_DE", "fr_FR",
                                         "ja_JP")}
    for f in fakers.values():
        f.seed_instance(seed)
    us, gb, cn = fakers["en_US"], fakers["en_GB"], fakers["zh_CN"]
    for loc, f in fakers.items():
        for _ in range(12):
            out.append(("EMAIL_ADDRESS", f.email(), f"faker:{loc}"))
        for _ in range(6):
            iban = f.iban()
            if _iban_ok(iban):  # Faker also makes IBANs of the wrong length for their country
                out.append(("IBAN_CODE", iban, f"faker:{loc}"))
    for _ in range(40):
        out.append(("PHONE_NUMBER", us.phone_number().split("x")[0], "faker:en_US"))
    for _ in range(30):
        out.append(("PHONE_NUMBER", gb.phone_number(), "faker:en_GB"))
    for _ in range(40):
        out.append(("CN_MOBILE", cn.phone_number(), "faker:zh_CN"))
    for card_type in ("amex", "diners", "discover", "jcb15", "jcb16", "maestro", "mastercard",
                      "visa13", "visa16", "visa19"):
        for _ in range(8):
            out.append(("CREDIT_CARD", us.credit_card_number(card_type=card_type),
                        f"faker:en_US:{card_type}"))
    for _ in range(40):
        out.append(("US_SSN", us.ssn(), "faker:en_US"))
    for _ in range(40):
        out.append(("CN_RESIDENT_ID", cn.ssn(), "faker:zh_CN"))
    for _ in range(25):
        out.append(("IP_ADDRESS", us.ipv4_public(), "faker:en_US"))
    for _ in range(15):
        out.append(("IP_ADDRESS", us.ipv6(), "faker:en_US"))
    return out


def faker_rows(seed: int = 20261201) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows = []
    for kind, value, source in _faker_values(seed):
        label, key, zlabel = LABELS[kind]
        styles = ZH_STYLES if ((kind in ("CN_MOBILE", "CN_RESIDENT_ID") and rnd.random() < 0.7)
                               or rnd.random() < 0.2) else EN_STYLES
        text = rnd.choice(styles).format(v=value, label=label, key=key, zlabel=zlabel)
        rows.append({"text": text, "entities": [{"kind": kind, "value": value}],
                     "category": f"positive:{kind.lower()}", "source": source})
    return rows


# ---------------------------------------------------------------------------------------------
# Hand-written hard negatives (shapes that look like PII and are not)
# ---------------------------------------------------------------------------------------------
NEGATIVE_TEMPLATES = [
    "int max = 2147483647;", "uint32 max is 4294967295", "INV-{d10}", "uid={d11}",
    "Mozilla/5.0 (X11; Linux x86_64) Chrome/122.0.{d4}.{d3} Safari/537.36",
    "升级到 {v1}.{v1}.{v1}.{v1} 版本后问题解决了", "see section {v1}.{v1}.{v1}.{v1} of the spec",
    "git@github.com:org/repo{d2}.git", "git clone git@gitlab.com:team/service.git",
    "Order No. {d10} shipped", "订单号：{d12}", "运单号 {d12} 已签收", "tracking number {d12}",
    "build {d5} finished in {d2}.{d1}s", "version {v1}.{d2}.{d3}", "v{v1}.{v1}.{d2}",
    "commit {h40}", "sha256 {h64}", "request id {uuid}", "trace_id={h32}",
    "timestamp {ts} ms", "epoch {ts10}", "price ${d3}.{d2}", "total: ¥{d4}.{d2}",
    "snmp oid 1.3.6.1.4.1.{d4}", "meeting ID {d3} {d3} {d4}", "会议号 {d3} {d3} {d3}",
    "Room 4{d2}, floor {v1}", "page {d3} of {d4}", "isbn 978-{v1}-{d3}-{d5}-{v1}",
    "ticket #{d7} closed", "case ref {d9}", "SKU {d8}", "batch {d6}-{d4}",
    "lat {d2}.{d6}, lon -{d3}.{d6}", "ratio 1:{v1}:{v1}:{v1}", "MAC aa:bb:cc:{h2}:{h2}:{h2}",
    "Time {d2}:{d2}:{d2}", "port 80:443 open", "color #{h6}", "chmod 0755 file{d2}.sh",
    "the answer is {d2} and {d3}", "Processed {d6} rows in {d3} ms", "ID {d6}",
    "pid {d5} exited with {v1}", "docker image sha {h12}", "temperature {d2}.{v1}°C",
    "weight {d3}g, size {d2}x{d2}x{d2} cm", "2023年11月15日 14:{d2} 发货", "第{d3}期 共{d4}人",
    "invoice {d10} paid", "seed = {d9}", "offset={d10}", "user_id={d12}", "account id {d10}",
    "password reset link expired", "the token was revoked", "set your api key in settings",
    "use Bearer authentication", "sk-this-is-not-a-real-key-at-all", "see RFC {d4}",
    "zip code {d5}-{d4}", "postal code {d5}", "call function f({d3}, {d3}, {d4})",
    "matrix [[{d3}, {d3}], [{d4}, {d2}]]", "{d2}/{d2}/{d4}", "image_{d8}_{d6}.png",
    "https://example.com/path/{d6}?page={d2}", "email me later", "my handle is @jdoe{d2}",
    "@channel please review PR #{d4}", "C:\\Users\\admin\\file_{d6}.txt",
]


def negative_rows(seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)

    def digits(n: int) -> str:
        return str(rnd.randint(1, 9)) + "".join(str(rnd.randint(0, 9)) for _ in range(n - 1))

    def hexs(n: int) -> str:
        return "".join(rnd.choice("0123456789abcdef") for _ in range(n))

    rows = []
    for _round in range(4):
        for template in NEGATIVE_TEMPLATES:
            fields = {f"d{n}": digits(n) for n in range(1, 13)}
            fields.update({f"h{n}": hexs(n) for n in (2, 6, 12, 32, 40, 64)})
            fields.update(v1=str(rnd.randint(0, 9)), ts=digits(13), ts10="17" + digits(8),
                          uuid=f"{hexs(8)}-{hexs(4)}-4{hexs(3)}-a{hexs(3)}-{hexs(12)}")
            text = template.format(**fields)
            rows.append({"text": text, "entities": [], "category": "hard_negative:hand",
                         "source": "hand:negative"})
    seen: set[str] = set()
    return [r for r in rows if not (r["text"] in seen or seen.add(r["text"]))]  # type: ignore[func-returns-value]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for e in row["entities"]:
            if e["value"] not in row["text"]:
                raise SystemExit(f"gold value not in text: {row}")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    cats: dict[str, int] = {}
    for r in rows:
        cats[r["category"]] = cats.get(r["category"], 0) + 1
    print(f"{len(rows)} rows -> {path}")
    for c, n in sorted(cats.items()):
        print(f"  {c}: {n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presidio", type=Path, metavar="PATH",
                    help="local git clone of microsoft/presidio (with --detect-secrets)")
    ap.add_argument("--detect-secrets", type=Path, metavar="PATH",
                    help="local git clone of Yelp/detect-secrets (with --presidio)")
    args = ap.parse_args()
    if (args.presidio is None) != (args.detect_secrets is None):
        ap.error("--presidio and --detect-secrets go together")
    _write(OUT, faker_rows() + negative_rows())
    # held out: new Faker values and new random negatives, never looked at while tuning
    holdout = faker_rows(seed=424242) + negative_rows(seed=99)
    for row in holdout:
        row["source"] += ":holdout"
    _write(HOLDOUT, holdout)
    if args.presidio is not None:
        _write(UPSTREAM, presidio_rows(args.presidio) + detect_secrets_rows(args.detect_secrets))
    else:
        print(f"no --presidio/--detect-secrets: {UPSTREAM.name} not built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
