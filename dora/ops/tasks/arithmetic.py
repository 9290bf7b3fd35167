"""A small exact-answer task: "12+7=" -> "19". Reward 1 for the exact number, else 0.

Useful with math_verify / format rewards and for dataset tests; too hard for a random tiny
model to learn in minutes (use the quickstart task for that).
"""

from __future__ import annotations

import random


class Arithmetic:
    name = "arithmetic"

    def make(self, size: int, seed: int, max_operand: int = 20, ops: str = "+-") -> list[dict]:
        rng = random.Random(seed)
        rows = []
        for _ in range(size):
            a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value)})
        return rows

    def score(self, response_text: str, answer: str) -> float:
        return 1.0 if response_text.strip() == answer.strip() else 0.0


TASK = Arithmetic()
