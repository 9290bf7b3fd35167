"""Arithmetic a small model cannot do in its head, with a Python tool it may call (pipelines/agentic_calc.yaml).

Prompt (chat messages): a system message saying how to call the tool, one worked example (the
question, a tool call, the tool's output, the bare answer), then the question, e.g. "What is
482 * 317?". The call format follows the generate op's `tool_parser`: `tag` (the default here)
writes <python>print(12*34)</python>, `hermes` writes <tool_call>{"name": "python", "arguments":
{"code": "print(12*34)"}}</tool_call>; the example's tool output is shown the way the pipeline's
observation_template frames it (<output>...</output> in a user turn).

Reward 1 when the last integer of the model's final turn (the reward op scores `final_turn_text`
for multi-turn rows, never the tool's output) equals the answer, else 0; a final turn that is
itself a tool call (the trajectory ran out of turns) scores 0 even when it holds the number.

Measured with SmolLM2-135M-Instruct (docs/benchmarks.md): at temperature 0.7 it calls the tool on
about a third of the 3-digit products and, when it does, copies the result; it almost never gets
one right without the tool. So GRPO has signal in most groups: call the tool, then answer.
"""

from __future__ import annotations

import json
import random
import re

INTEGER = re.compile(r"-?\d[\d,]*")
EXAMPLE = (12, 34)


class ToolArithmetic:
    name = "tool_arithmetic"

    def make(self, size: int, seed: int, digits: int = 3, ops: str = "*", call_format: str = "tag") -> list[dict]:
        if digits < 1 or not ops or set(ops) - set("+-*") or call_format not in ("tag", "hermes"):
            raise ValueError(f"tool_arithmetic: digits >= 1, ops from '+-*', call_format tag|hermes; got "
                             f"digits={digits}, ops={ops!r}, call_format={call_format!r}")
        rng = random.Random(seed)
        lo, hi = 10 ** (digits - 1), 10 ** digits - 1
        rows = []
        for _ in range(size):
            a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
            rows.append({"prompt": messages(a, op, b, call_format), "answer": str(evaluate(a, op, b))})
        return rows

    def score(self, response_text: str, answer: str) -> float:
        if "<python>" in response_text or "<tool_call>" in response_text:
            return 0.0
        found = INTEGER.findall(response_text)
        return 1.0 if found and found[-1].replace(",", "") == answer.strip() else 0.0


def evaluate(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def call_text(code: str, call_format: str) -> str:
    if call_format == "hermes":
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    return f"<python>{code}</python>"


def messages(a: int, op: str, b: int, call_format: str) -> list[dict[str, str]]:
    x, y = EXAMPLE
    how = call_text(f"print({x}*{y})", call_format)
    system = ("You are a calculator assistant. You cannot do arithmetic in your head. To compute, write Python "
              f"code for the python tool, for example:\n{how}\nThe output comes back in <output>. Then reply with "
              "only the final number.")
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"What is {x} * {y}?"},
            {"role": "assistant", "content": how},
            {"role": "user", "content": f"<output>{x * y}</output>"},
            {"role": "assistant", "content": str(x * y)},
            {"role": "user", "content": f"What is {a} {op} {b}?"}]


TASK = ToolArithmetic()
