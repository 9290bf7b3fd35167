"""Okapi BM25 over a small in-memory corpus (pure Python): score(q, d) = sum over query terms t of
idf(t) * f(t, d) (k1 + 1) / (f(t, d) + k1 (1 - b + b |d| / avgdl)), idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)).
Terms: lower-cased runs of letters and digits (a decimal number stays one term)."""

from __future__ import annotations

import collections
import math
import re

TERM = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def terms(text: str) -> list[str]:
    return TERM.findall(text.lower())


class BM25:
    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.freqs = [collections.Counter(terms(d)) for d in docs]
        self.lengths = [sum(f.values()) for f in self.freqs]
        self.avgdl = sum(self.lengths) / len(docs) if docs else 0.0
        df = collections.Counter(t for f in self.freqs for t in f)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def scores(self, query: str) -> list[float]:
        q = terms(query)
        out = []
        for f, dl in zip(self.freqs, self.lengths):
            norm = self.k1 * (1 - self.b + self.b * dl / self.avgdl) if self.avgdl else self.k1
            out.append(sum(self.idf[t] * f[t] * (self.k1 + 1) / (f[t] + norm) for t in q if t in f))
        return out

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        """The k best (doc index, score) with a score > 0, best first (ties: corpus order)."""
        ranked = sorted(((s, -i) for i, s in enumerate(self.scores(query)) if s > 0), reverse=True)[:k]
        return [(-i, s) for s, i in ranked]
