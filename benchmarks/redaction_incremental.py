"""Per-turn redaction cost over a long chat: does it follow the new content or the history?

Simulates a 200-turn support chat. Each turn adds four messages (user message with PII, AI
message with a tool call, a ~1.5 KB JSON tool result, AI answer) and then, as the saver does,
calls ``Redactor.redact_value`` on the WHOLE ``messages`` list. Two modes:

* ``same``: the list holds the same message objects from turn to turn (a graph running in
  one process);
* ``reloaded``: every turn the history is read back like the saver does at the start of an
  invocation: the previous redacted list is deep-copied (deserialized) and passed through
  ``restore_value``; the restored messages are new objects, so only content-based caching
  can help. The restore time is printed for information (no target).

For each mode it prints the per-turn time around turn 20 and around turn 200 (median of the
10 turns ending there, best of 5 runs to damp machine noise), the characters analyzed
per turn, and the ratio. Exits non-zero if turn 200 costs more than 1.3x turn 20.

Usage: python benchmarks/redaction_incremental.py [--turns 200] [--runs 3]
"""
# ruff: noqa: RUF001  (full-width Chinese punctuation and digits are test data)

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import statistics
import sys
import time
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from langgraph_securesaver.redaction import Redactor

TARGET_RATIO = 1.3
PRODUCTS = ["无线耳机 Pro", "USB-C 充电器 65W", "机械键盘", "4K 显示器 27寸", "Laptop stand",
            "Noise-cancelling headphones", "智能手表 S3", "移动电源 20000mAh"]


def make_turn(i: int, rng: random.Random) -> list[BaseMessage]:
    email = f"{rng.choice(['zhang.wei', 'li.na', 'wang_lei', 'emma.w'])}{i}@example.com"
    phone = f"1{rng.choice('3589')}{rng.randint(0, 9)}{rng.randint(10_000_000, 99_999_999)}"
    order = f"2024{rng.randint(10**9, 10**10 - 1)}"
    user = HumanMessage(
        f"你好，我是第{i}次联系了。订单 {order} 还没到，我的手机是{phone}，邮箱{email}。"
        f"Could you check the delivery status and tell me when it will arrive? 谢谢！",
        id=f"human-{i}")
    call_id = f"call_{i:04d}"
    ai_call = AIMessage(
        content="我来帮您查询一下订单状态。",
        tool_calls=[{"name": "lookup_order", "args": {"order_id": order, "email": email},
                     "id": call_id}],
        response_metadata={"model_name": "gpt-4o-2024-08-06", "finish_reason": "tool_calls"},
        id=f"ai-call-{i}")
    items = [{"sku": f"SKU-{rng.randint(1000, 9999)}", "name": rng.choice(PRODUCTS),
              "qty": rng.randint(1, 3), "unit_price": round(rng.uniform(20, 900), 2)}
             for _ in range(rng.randint(2, 4))]
    result: dict[str, Any] = {
        "order_id": order,
        "status": rng.choice(["shipped", "in_transit", "out_for_delivery"]),
        "customer": {"name": "张伟", "email": email, "phone": phone,
                     "address": f"上海市徐汇区漕溪北路{rng.randint(1, 999)}号"},
        "items": items,
        "shipment": {"carrier": "SF Express", "tracking_no": f"SF{rng.randint(10**12, 10**13)}",
                     "events": [{"time": f"2024-11-{d:02d}T{rng.randint(8, 20)}:00:00+08:00",
                                 "desc": rng.choice(["已揽收", "运输中", "到达上海转运中心",
                                                     "派送中"])} for d in range(10, 14)]},
        "login_ip": f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
    }
    tool = ToolMessage(json.dumps(result, ensure_ascii=False), tool_call_id=call_id,
                       name="lookup_order", id=f"tool-{i}")
    answer = AIMessage(
        content=(f"您的订单 {order} 目前状态为 {result['status']}，由顺丰配送，运单号 "
                 f"{result['shipment']['tracking_no']}。预计 1-2 天内送达。"
                 "We will notify you by email once it is delivered. 如有其他问题请随时联系我们。"
                 " Thanks for your patience — the carrier reported a short delay at the hub "
                 "this week, so deliveries may arrive later than the original estimate."),
        response_metadata={"model_name": "gpt-4o-2024-08-06", "finish_reason": "stop"},
        id=f"ai-answer-{i}")
    return [user, ai_call, tool, answer]


def run(mode: str, turns: int, seed: int) -> tuple[list[float], list[int], list[float]]:
    # The cyclic GC is paused while the simulation runs: its pauses grow with the heap (the
    # deep copies of the history made by the simulation itself) and land at random places.
    gc.collect()
    gc.disable()
    try:
        return _run(mode, turns, seed)
    finally:
        gc.enable()


def _run(mode: str, turns: int, seed: int) -> tuple[list[float], list[int], list[float]]:
    rng = random.Random(seed)
    redactor = Redactor()
    key = b"tenant-key-for-benchmark-000000"
    redactor.redact_value(make_turn(0, random.Random(0)), channel="messages", token_key=key)
    vault: dict[str, str] = {}

    def lookup(tokens: Any) -> dict[str, str]:
        return {t: vault[t] for t in tokens if t in vault}

    history: list[BaseMessage] = []
    stored: list[BaseMessage] = []
    times: list[float] = []
    chars: list[int] = []
    restore_times: list[float] = []
    for i in range(1, turns + 1):
        if mode == "reloaded":  # read the checkpoint back: deserialize (copy) and restore
            loaded = copy.deepcopy(stored)
            t0 = time.perf_counter()
            history = redactor.restore_value(loaded, lookup)
            restore_times.append(time.perf_counter() - t0)
        history = [*history, *make_turn(i, rng)]
        before = redactor.stats.chars_analyzed
        t0 = time.perf_counter()
        stored, entries = redactor.redact_value(history, channel="messages", token_key=key)
        times.append(time.perf_counter() - t0)
        chars.append(redactor.stats.chars_analyzed - before)
        vault.update((e.token, e.value) for e in entries)
    return times, chars, restore_times


def window(values: list[float], end_turn: int) -> float:
    return statistics.median(values[max(0, end_turn - 10):end_turn])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    early, late = 20, args.turns
    failed = False
    print(f"{args.turns} turns, 4 messages per turn; per-turn redact_value of the whole list")
    print(f"{'mode':<10}{'turn':>6}{'messages':>10}{'µs/turn':>10}{'chars analyzed':>16}")
    for mode in ("same", "reloaded"):
        best_early = best_late = float("inf")
        restore_early = restore_late = float("inf")
        chars: list[int] = []
        for r in range(args.runs):
            times, chars, restores = run(mode, args.turns, seed=r)
            best_early = min(best_early, window(times, early))
            best_late = min(best_late, window(times, late))
            if restores:
                restore_early = min(restore_early, window(restores, early))
                restore_late = min(restore_late, window(restores, late))
        chars_early = statistics.mean(chars[early - 10:early])
        chars_late = statistics.mean(chars[late - 10:late])
        print(f"{mode:<10}{early:>6}{early * 4:>10}{best_early * 1e6:>10.0f}{chars_early:>16.0f}")
        print(f"{mode:<10}{late:>6}{late * 4:>10}{best_late * 1e6:>10.0f}{chars_late:>16.0f}")
        ratio = best_late / best_early
        verdict = "ok" if ratio <= TARGET_RATIO else "TOO SLOW"
        print(f"{mode:<10} turn {late} / turn {early} = {ratio:.2f}x "
              f"(target <= {TARGET_RATIO}x): {verdict}")
        if restore_early != float("inf"):
            print(f"{mode:<10} (info) restore_value of the loaded history: turn {early} "
                  f"{restore_early * 1e6:.0f} µs, turn {late} {restore_late * 1e6:.0f} µs")
        failed = failed or ratio > TARGET_RATIO
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
