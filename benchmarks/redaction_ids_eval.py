"""Recall of the kinds redaction/id_recognizers.py claims, on values from Faker.

Faker's own providers (seeded) make the values: UK NINO (en_GB ``ssn``), FR NIR (fr_FR
``ssn``), IT codice fiscale (it_IT ``ssn``), BR CPF, KR RRN (ko_KR ``ssn``), IN Aadhaar,
PL PESEL, ES NIF/NIE, NL BSN (nl_NL ``ssn``), lower-case IBANs, and Faker's phone numbers
with an ``x`` extension. Each value goes into three sentences (a label and a colon, prose, a
JSON field); a value counts as found when a detection of its kind covers all of it. The
recognizers were not written from Faker's output; false positives are measured on the hard
negatives of ``redaction_eval.py`` (0 of 665 when this script was added).

Target: recall >= 0.995 (issue 40's bar). Faker writes KR RRNs with a month or day of 00;
they are claimed since the dashed RRN shape allows 00 (misses are printed with ``--errors``).
benchmarks/redaction_locales_eval.py is the independent measure of the same kinds.

Usage: python benchmarks/redaction_ids_eval.py [--per-kind 40] [--errors]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from faker import Faker

from langgraph_securesaver.redaction import Redactor

LABELS = {"UK_NINO": "NI number", "FR_NIR": "numéro de sécurité sociale",
          "IT_FISCAL_CODE": "codice fiscale", "BR_CPF": "CPF", "KR_RRN": "주민등록번호",
          "IN_AADHAAR": "Aadhaar", "PL_PESEL": "PESEL", "ES_NIF": "NIF", "ES_NIE": "NIE",
          "NL_BSN": "BSN", "IBAN_CODE": "iban", "PHONE_NUMBER": "phone"}
SOURCES: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("UK_NINO", "en_GB", lambda f: f.ssn()), ("FR_NIR", "fr_FR", lambda f: f.ssn()),
    ("IT_FISCAL_CODE", "it_IT", lambda f: f.ssn()), ("BR_CPF", "pt_BR", lambda f: f.cpf()),
    ("KR_RRN", "ko_KR", lambda f: f.ssn()), ("IN_AADHAAR", "en_IN", lambda f: f.aadhaar_id()),
    ("PL_PESEL", "pl_PL", lambda f: f.pesel()), ("ES_NIF", "es_ES", lambda f: f.nif()),
    ("ES_NIE", "es_ES", lambda f: f.nie()), ("NL_BSN", "nl_NL", lambda f: f.ssn()),
    ("IBAN_CODE", "en_GB", lambda f: f.iban().lower())]
TEMPLATES = ("{label}: {v}", "please update my {label} to {v} thanks", '{{"{label}": "{v}"}}')
TARGET = 0.995


def values(per_kind: int) -> list[tuple[str, str]]:
    out = []
    for kind, locale, make in SOURCES:
        fake = Faker(locale)
        fake.seed_instance(1234)
        out += [(kind, str(make(fake))) for _ in range(per_kind)]
    for locale in ("en_US", "en_GB", "de_DE", "fr_FR", "en_AU", "en_CA"):
        fake = Faker(locale)
        fake.seed_instance(7)
        phones = [p for p in (fake.phone_number() for _ in range(3000)) if "x" in p]
        out += [("PHONE_NUMBER", p) for p in phones[:15]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=40)
    ap.add_argument("--errors", action="store_true")
    args = ap.parse_args()
    redactor, key = Redactor(), b"k" * 32
    gold, found, misses = Counter[str](), Counter[str](), []
    for kind, value in values(args.per_kind):
        for template in TEMPLATES:
            text = template.format(label=LABELS[kind], v=value)
            at = text.find(value)
            entities = redactor.redact(text, token_key=key).entities
            gold[kind] += 1
            if any(e.kind == kind and e.start <= at and e.end >= at + len(value)
                   for e in entities):
                found[kind] += 1
            else:
                misses.append(f"MISS {kind}: {text!r} -> {[e.kind for e in entities]}")
    for kind in sorted(gold):
        print(f"{kind:16}{found[kind]:>5}/{gold[kind]:<5}{found[kind] / gold[kind]:.3f}")
    recall = sum(found.values()) / sum(gold.values())
    print(f"{'ALL':16}{sum(found.values()):>5}/{sum(gold.values()):<5}{recall:.4f} "
          f"(target >= {TARGET})")
    if args.errors:
        print("\n".join(misses))
    return 0 if recall >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
