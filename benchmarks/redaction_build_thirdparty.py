"""Build the third-party evaluation: ``benchmarks/data/thirdparty_dev.jsonl`` and
``benchmarks/data/thirdparty_holdout.jsonl``. Neither is committed (git-ignored); both are
rebuilt from sources fetched at build time:

* **Faker** (PyPI, the ``bench`` extra): phone numbers exactly as the providers print them
  (en_US with extensions ``x1234`` and the ``001-``/``+1-`` prefixes, en_CA, en_GB incl.
  ``cellphone_number``, zh_CN, de_DE, fr_FR, es_ES, it_IT, nl_NL, en_AU, pt_BR, en_IN), SSNs
  (en_US), PRC resident IDs (zh_CN ``ssn``), card numbers of every issuer Faker knows,
  e-mails of eight locales (also percent-encoded in URLs, as HTML character references and
  with an invisible character inside: the shapes e-mail obfuscators and URL builders emit,
  produced with the standard library's encoders), IPv4/IPv6, IBANs. Phone numbers without
  ``+`` of regions the default engine does not claim (only US/CA, GB and CN are claimed) are
  ``out_of_scope`` (reported, not counted). A share of the zh_CN mobiles is regrouped the way
  people write them (3-4-4, 3-8, 7-4, ``+86``, full-width digits).
* **loghub** (github.com/logpai/loghub, ``--loghub PATH``): real log lines of 16 open-source
  systems (HDFS, Hadoop, Spark, Zookeeper, OpenStack, OpenSSH, Linux, Mac, Windows, Android,
  Apache, BGL, HPC, Thunderbird, HealthApp, Proxifier). A line without a dotted IPv4 address
  is a hard negative (block ids, pids, epochs, ports, versions, hostnames); a line with one
  is a positive whose gold is every dotted quad and every colon-hex IPv6 form ``ipaddress``
  accepts (lines with an
  ambiguous quad — all one-digit octets, or part of a longer dotted number — are dropped).
  Faker values are also appended to real lines as ``key=value`` / ``key: value`` pairs, the
  way services log them.
* **presidio** and **detect-secrets** (``--presidio PATH --detect-secrets PATH``): the test
  vectors of their recognizer/plugin tests (see ``redaction_build_eval.py``).

PATH is a git clone (or bare git directory) of each repository; files are read with
``git show HEAD:<path>``. Each row goes to the dev or the held-out file by a hash of its text
(one in four to dev). Only the dev part is looked at when tuning; the held-out part is the
measure.

``--fresh SEED`` writes ``thirdparty_fresh.jsonl`` instead: Faker values and log lines drawn
with another seed, minus every text of the two files above — a second held-out set for
measuring after a round of tuning (never looked at before it is measured).

Usage: python benchmarks/redaction_build_thirdparty.py --loghub PATH [--presidio PATH
       --detect-secrets PATH] [--fresh SEED]
"""

# ruff: noqa: RUF001 - full-width digits on purpose
from __future__ import annotations

import argparse
import hashlib
import html
import ipaddress
import json
import random
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from redaction_build_eval import (  # a sibling script
    EN_STYLES,
    ZH_STYLES,
    _iban_ok,
    detect_secrets_rows,
    presidio_rows,
)

DATA = Path(__file__).parent / "data"
DEV = DATA / "thirdparty_dev.jsonl"
HOLDOUT = DATA / "thirdparty_holdout.jsonl"
FRESH = DATA / "thirdparty_fresh.jsonl"
SEED = 20261202

CLAIMED_PHONE_LOCALES = ("en_US", "en_CA", "en_GB", "zh_CN")
OTHER_PHONE_LOCALES = ("de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "en_AU", "pt_BR", "en_IN")
EMAIL_LOCALES = ("en_US", "en_GB", "zh_CN", "de_DE", "fr_FR", "ja_JP", "es_ES", "it_IT")
KEYS = {
    "PHONE_NUMBER": ("to", "phone", "number", "msisdn", "caller", "tel", "from", "callback"),
    "CN_MOBILE": ("to", "mobile", "phone", "手机号", "number"),
    "EMAIL_ADDRESS": ("email", "to", "user", "recipient", "mail", "from"),
    "CREDIT_CARD": ("card", "card_number", "pan", "cc", "cardNumber"),
    "US_SSN": ("ssn", "social_security_number", "SSN"),
    "IP_ADDRESS": ("client_ip", "src", "remote_addr", "ip", "rhost", "peer"),
    "CN_RESIDENT_ID": ("id_card", "身份证号", "idcard", "id_number"),
    "IBAN_CODE": ("iban", "account", "IBAN"),
}
LABELS = {"PHONE_NUMBER": ("phone number", "电话"), "CN_MOBILE": ("mobile", "手机号"),
          "EMAIL_ADDRESS": ("email", "邮箱"), "CREDIT_CARD": ("card number", "卡号"),
          "US_SSN": ("SSN", "社会安全号"), "IP_ADDRESS": ("IP address", "IP地址"),
          "CN_RESIDENT_ID": ("ID number", "身份证号"), "IBAN_CODE": ("IBAN", "银行账号")}
_FULLWIDTH = str.maketrans("0123456789+", "０１２３４５６７８９＋")
_INVISIBLE = ("\u200b", "\u2060", "\u3164", "\uffa0", "\u115f", "\u00ad", "\ufeff")


def git_show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_files(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD"],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


# ---------------------------------------------------------------------------------------------
# loghub: real log lines
# ---------------------------------------------------------------------------------------------
_QUAD = re.compile(r"(?<![0-9.])[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9]|\.[0-9])")
_HEXCOLON = re.compile(r"(?<![0-9A-Za-z])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Za-z:])")
_AMBIGUOUS = re.compile(r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]|[0-9]{1,3}(?:\.[0-9]"
                        r"{1,3}){3}\.[0-9]|(?<![0-9.])[0-9](?:\.[0-9]){3}(?![0-9])")


def loghub_lines(repo: Path, per_system: int, rnd: random.Random) -> list[tuple[str, str]]:
    """(system, line) samples; each system's raw ``*_2k.log``."""
    out = []
    for path in sorted(p for p in git_files(repo) if p.endswith("_2k.log")):
        lines = [ln for ln in git_show(repo, path).splitlines() if ln.strip()]
        rnd.shuffle(lines)
        out.extend((path.split("/")[0], ln[:400]) for ln in lines[:per_system])
    return out


def loghub_rows(lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    seen: set[str] = set()
    for system, line in lines:
        if line in seen or _AMBIGUOUS.search(line):
            continue
        seen.add(line)
        gold = []
        for m in (*_QUAD.finditer(line), *_HEXCOLON.finditer(line)):
            if m.group(0).count(":") == 1:
                continue
            try:
                ipaddress.ip_address(m.group(0))
            except ValueError:
                continue
            gold.append({"kind": "IP_ADDRESS", "value": m.group(0)})
        source = f"loghub:{system}"
        if gold:
            rows.append({"text": line, "entities": gold, "category": "positive:ip_address",
                         "source": source})
        else:
            rows.append({"text": line, "entities": [], "category": "hard_negative:loghub",
                         "source": source})
    return rows


# ---------------------------------------------------------------------------------------------
# Faker values
# ---------------------------------------------------------------------------------------------
def _regroup_cn(value: str, rnd: random.Random) -> tuple[str, str]:
    d = value
    style = rnd.choice(["3-4-4 space", "3-4-4 hyphen", "3-8", "7-4", "+86", "full-width",
                        "+86 full-width"])
    if style == "3-4-4 space":
        return f"{d[:3]} {d[3:7]} {d[7:]}", style
    if style == "3-4-4 hyphen":
        return f"{d[:3]}-{d[3:7]}-{d[7:]}", style
    if style == "3-8":
        return f"{d[:3]}{rnd.choice(' -')}{d[3:]}", style
    if style == "7-4":
        return f"{d[:7]} {d[7:]}", style
    if style == "+86":
        return f"+86{rnd.choice(['', ' ', '-'])}{d[:3]}-{d[3:7]}-{d[7:]}", style
    if style == "full-width":
        return f"{d[:3]} {d[3:7]} {d[7:]}".translate(_FULLWIDTH), style
    return f"+86 {d[:3]} {d[3:7]} {d[7:]}".translate(_FULLWIDTH), style


def _encoded_emails(email: str, rnd: random.Random) -> list[tuple[str, str]]:
    """(text holding the e-mail in an encoded form, the encoded value)."""
    quoted = urllib.parse.quote(email, safe="")
    query = urllib.parse.urlencode({"email": email, "next": "/account"})
    refs = "".join(f"&#{ord(c)};" for c in email)
    hexrefs = email.replace("@", "&#x40;").replace(".", "&#x2e;")
    named = email.replace("@", "&commat;")
    local, _, domain = email.partition("@")
    cut = rnd.randint(1, max(1, len(local) - 1))
    hidden = local[:cut] + rnd.choice(_INVISIBLE) + local[cut:] + "@" + domain
    return [
        (f"https://example.org/unsubscribe?{query}", quoted),
        (f"<a href=\"mailto:{refs}\">{html.escape('contact')}</a>", refs),
        (f"mailto%3A{quoted}", quoted),
        (f"Contact: {hexrefs}", hexrefs),
        (f"<p>Write to {named} for help</p>", named),
        (f"reply to {hidden} please", hidden),
    ]


def faker_values(seed: int) -> list[tuple[str, str, str, bool]]:
    """(kind, value, source, claimed)."""
    from faker import Faker

    rnd = random.Random(seed)
    out: list[tuple[str, str, str, bool]] = []

    def faker(loc: str) -> Any:
        f = Faker(loc)
        f.seed_instance(seed + sum(map(ord, loc)))
        return f

    for loc in CLAIMED_PHONE_LOCALES:
        f = faker(loc)
        kind = "CN_MOBILE" if loc == "zh_CN" else "PHONE_NUMBER"
        for _ in range(60):
            value = f.phone_number()
            source = f"faker:{loc}:phone_number"
            if loc == "zh_CN" and rnd.random() < 0.5:
                value, style = _regroup_cn(value, rnd)
                source = f"faker:{loc}:phone_number:regrouped:{style}"
            out.append((kind, value, source, True))
        if loc == "en_GB":
            for _ in range(30):
                out.append((kind, f.cellphone_number(), f"faker:{loc}:cellphone_number", True))
    for loc in OTHER_PHONE_LOCALES:
        f = faker(loc)
        for _ in range(30):
            value = f.phone_number()
            out.append(("PHONE_NUMBER", value, f"faker:{loc}:phone_number",
                        value.startswith("+")))
    us, cn = faker("en_US"), faker("zh_CN")
    for _ in range(60):
        out.append(("US_SSN", us.ssn(), "faker:en_US:ssn", True))
        out.append(("CN_RESIDENT_ID", cn.ssn(), "faker:zh_CN:ssn", True))
    for card_type in ("amex", "diners", "discover", "jcb15", "jcb16", "maestro", "mastercard",
                      "visa13", "visa16", "visa19"):
        for _ in range(12):
            out.append(("CREDIT_CARD", us.credit_card_number(card_type=card_type),
                        f"faker:en_US:credit_card:{card_type}", True))
    for loc in EMAIL_LOCALES:
        f = faker(loc)
        for _ in range(15):
            out.append(("EMAIL_ADDRESS", rnd.choice([f.email, f.free_email, f.company_email])(),
                        f"faker:{loc}:email", True))
        for _ in range(8):
            iban = f.iban()
            if _iban_ok(iban):
                out.append(("IBAN_CODE", iban, f"faker:{loc}:iban", True))
    for _ in range(40):
        out.append(("IP_ADDRESS", us.ipv4_public(), "faker:en_US:ipv4_public", True))
        out.append(("IP_ADDRESS", us.ipv4_private(), "faker:en_US:ipv4_private", True))
    for _ in range(30):
        out.append(("IP_ADDRESS", us.ipv6(), "faker:en_US:ipv6", True))
    return out


def faker_rows(seed: int, log_lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows = []
    log_lines = [(sy, ln) for sy, ln in log_lines  # lines without any address in them
                 if [r["entities"] for r in loghub_rows([(sy, ln)])] == [[]]]

    def add(text: str, kind: str, value: str, source: str, claimed: bool) -> None:
        cat = f"positive:{kind.lower()}" if claimed else "out_of_scope:phone_region"
        rows.append({"text": text, "entities": [{"kind": kind, "value": value}],
                     "category": cat, "source": source})

    for kind, value, source, claimed in faker_values(seed):
        key = rnd.choice(KEYS[kind])
        style = rnd.random()
        if style < 0.45 and log_lines:  # a real log line with the value as a key=value pair
            _system, line = rnd.choice(log_lines)
            pair = rnd.choice([f"{key}={value}", f"{key}: {value}", f'{key}="{value}"',
                               f"[{key}={value}]", f"{key}={value},"])
            text = f"{line} {pair}"
        elif style < 0.65:  # a JSON tool result / API payload
            doc = {"status": "ok", key: value, "ts": "2024-03-01T10:22:31Z"}
            text = json.dumps(doc, ensure_ascii=rnd.random() < 0.5)
            if not text.count(value):
                text = json.dumps(doc, ensure_ascii=False)
        elif style < 0.75 and kind in ("PHONE_NUMBER", "CN_MOBILE"):
            text = f"<a href=\"tel:{value}\">call us</a>"
        elif style < 0.85:
            text = value
        else:
            label, zlabel = LABELS[kind]
            template = rnd.choice(ZH_STYLES if rnd.random() < 0.3 else EN_STYLES)
            text = template.format(v=value, label=label, key=key, zlabel=zlabel)
        if value not in text:
            continue
        add(text, kind, value, source, claimed)
        if kind == "EMAIL_ADDRESS":
            text, encoded = rnd.choice(_encoded_emails(value, rnd))
            add(text, kind, encoded, source + ":encoded", True)
    return rows


def _split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    dev, held = [], []
    for row in rows:
        h = int(hashlib.sha256(row["text"].encode("utf-8")).hexdigest()[:8], 16)
        (dev if h % 4 == 0 else held).append(row)
    return dev, held


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
    ap.add_argument("--loghub", type=Path, metavar="PATH", required=True,
                    help="git clone of github.com/logpai/loghub")
    ap.add_argument("--presidio", type=Path, metavar="PATH",
                    help="git clone of github.com/microsoft/presidio")
    ap.add_argument("--detect-secrets", type=Path, metavar="PATH",
                    help="git clone of github.com/Yelp/detect-secrets")
    ap.add_argument("--per-system", type=int, default=150,
                    help="log lines sampled per loghub system (default 150)")
    ap.add_argument("--fresh", type=int, metavar="SEED",
                    help="write only thirdparty_fresh.jsonl: new Faker values and log lines "
                         "from SEED, minus every text already in the dev/held-out files")
    args = ap.parse_args()
    seed = SEED if args.fresh is None else args.fresh
    rnd = random.Random(seed)
    lines = loghub_lines(args.loghub, args.per_system, rnd)
    pool = loghub_lines(args.loghub, 60, random.Random(seed + 1))  # contexts for Faker values
    rows = loghub_rows(lines) + faker_rows(seed, pool)
    if args.fresh is not None:
        known = {json.loads(ln)["text"] for path in (DEV, HOLDOUT) if path.exists()
                 for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()}
        fresh = {r["text"]: r for r in rows if r["text"] not in known}
        _write(FRESH, list(fresh.values()))
        return 0
    if args.presidio is not None:
        rows += presidio_rows(args.presidio)
    if args.detect_secrets is not None:
        rows += detect_secrets_rows(args.detect_secrets)
    seen: set[str] = set()
    rows = [r for r in rows if not (r["text"] in seen or seen.add(r["text"]))]  # type: ignore[func-returns-value]
    dev, held = _split(rows)
    _write(DEV, dev)
    _write(HOLDOUT, held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
