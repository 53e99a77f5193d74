"""Evaluate the default Redactor on benchmarks/data/pii_eval.jsonl.

Prints per-kind precision / recall and the false-positive rate on hard negatives, and exits
non-zero when a target is missed:

* recall >= 0.98 for CN_RESIDENT_ID, API_SECRET, EMAIL_ADDRESS and CREDIT_CARD
* at most 2% of hard-negative sentences get any detection

A gold entity counts as found when a detection of the same kind covers its whole value.
"Covered (any kind)" also accepts a detection of another kind (the value is still hidden).

Usage: python benchmarks/redaction_eval.py [--errors] [--data PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from langgraph_securesaver.redaction import Redactor

DATA = Path(__file__).parent / "data" / "pii_eval.jsonl"
RECALL_TARGETS = {"CN_RESIDENT_ID": 0.98, "API_SECRET": 0.98, "EMAIL_ADDRESS": 0.98,
                  "CREDIT_CARD": 0.98}
HARD_NEGATIVE_FP_TARGET = 0.02


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--errors", action="store_true", help="print every miss and false positive")
    args = ap.parse_args()

    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    redactor = Redactor()
    key = b"k" * 32
    redactor.redact("warm up 13812345678", token_key=key)

    gold_n: Counter[str] = Counter()
    found: Counter[str] = Counter()
    covered_any: Counter[str] = Counter()
    pred_n: Counter[str] = Counter()
    pred_ok: Counter[str] = Counter()
    neg_total = 0
    neg_flagged = 0
    errors: list[str] = []
    t0 = time.perf_counter()
    for row in rows:
        text = row["text"]
        result = redactor.redact(text, token_key=key)
        preds = result.entities
        gold = []
        for g in row["entities"]:
            start = text.find(g["value"])
            if start < 0:
                raise SystemExit(f"gold value not in text: {g}")
            gold.append((g["kind"], start, start + len(g["value"])))
        is_negative = row.get("category", "").startswith("hard_negative")
        if is_negative:
            neg_total += 1
            if preds:
                neg_flagged += 1
        for kind, gs, ge in gold:
            gold_n[kind] += 1
            if any(p.kind == kind and p.start <= gs and p.end >= ge for p in preds):
                found[kind] += 1
                covered_any[kind] += 1
            elif any(p.start <= gs and p.end >= ge for p in preds):
                covered_any[kind] += 1
                errors.append(f"WRONG KIND {kind}: {text!r} -> "
                              f"{[(p.kind, p.text) for p in preds]}")
            else:
                errors.append(f"MISS {kind}: {text!r} -> {[(p.kind, p.text) for p in preds]}")
        for p in preds:
            pred_n[p.kind] += 1
            if any(kind == p.kind and p.start < ge and p.end > gs for kind, gs, ge in gold):
                pred_ok[p.kind] += 1
            else:
                tag = "FP (hard negative)" if is_negative else "FP"
                errors.append(f"{tag} {p.kind} {p.text!r} in {text!r}")
    elapsed = time.perf_counter() - t0

    kinds = sorted(set(gold_n) | set(pred_n))
    print(f"{len(rows)} sentences ({neg_total} hard negatives), "
          f"{sum(gold_n.values())} gold entities, {elapsed * 1000 / len(rows):.2f} ms/sentence")
    print(f"{'kind':<16}{'gold':>6}{'recall':>9}{'covered':>9}{'preds':>7}{'precision':>11}")
    for kind in kinds:
        g = gold_n[kind]
        recall = found[kind] / g if g else float("nan")
        cov = covered_any[kind] / g if g else float("nan")
        precision = pred_ok[kind] / pred_n[kind] if pred_n[kind] else float("nan")
        print(f"{kind:<16}{g:>6}{recall:>9.3f}{cov:>9.3f}{pred_n[kind]:>7}{precision:>11.3f}")
    total_gold = sum(gold_n.values())
    total_pred = sum(pred_n.values())
    print(f"{'ALL':<16}{total_gold:>6}{sum(found.values()) / total_gold:>9.3f}"
          f"{sum(covered_any.values()) / total_gold:>9.3f}{total_pred:>7}"
          f"{sum(pred_ok.values()) / max(total_pred, 1):>11.3f}")
    fp_rate = neg_flagged / neg_total if neg_total else 0.0
    print(f"hard negatives with any detection: {neg_flagged}/{neg_total} = {fp_rate:.1%}")

    if args.errors:
        print("\n".join(errors) if errors else "no errors")

    failed = []
    for kind, target in RECALL_TARGETS.items():
        recall = found[kind] / gold_n[kind] if gold_n[kind] else 0.0
        if recall < target:
            failed.append(f"{kind} recall {recall:.3f} < {target}")
    if fp_rate > HARD_NEGATIVE_FP_TARGET:
        failed.append(f"hard-negative FP rate {fp_rate:.1%} > {HARD_NEGATIVE_FP_TARGET:.0%}")
    if failed:
        print("TARGETS MISSED: " + "; ".join(failed))
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
