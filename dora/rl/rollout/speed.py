"""How much faster a request decodes on a less loaded instance, from what instances report.

A decode iteration costs a fixed part (reading the weights, launches, collectives) plus a part per
running request (its GEMM rows and its KV reads). Instances report their iteration time
(`InstanceStats.step_s`); regressing it on their running requests and KV use over recent reports
gives the fixed part (the intercept). Spreading b of an instance's B requests onto their own
instances makes each iteration fixed + (step - fixed) * b / B: that is the most it can buy, and
what the orchestrator asks for when a version's stragglers must go sigma times faster.
Engines that do not report step_s leave the fixed part at 0 (spreading then looks linear).
"""

from __future__ import annotations

import collections
import math

from .types import InstanceStats

WINDOW = 256        # recent reports kept for the fit (an engine's cost curve does not change during a run)


class SpeedModel:
    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=WINDOW)
        self._fixed: float | None = None

    def observe(self, st: InstanceStats) -> None:
        if st.active and st.step_s > 0:
            self.samples.append((float(st.active), st.kv_used_fraction, st.step_s))
            self._fixed = None

    def fixed_s(self) -> float:
        """Intercept of step_s ~ a + b * active + c * kv (least squares); 0 when unknown."""
        if self._fixed is None:
            self._fixed = _intercept(list(self.samples))
        return self._fixed

    def batch_for(self, batch: float, step_s: float, sigma: float) -> int:
        """Requests per instance that make each of them sigma times faster than at `batch`
        requests and `step_s` per iteration; `batch` itself (no spreading) if even alone they
        could not be: then spreading would cost throughput and still miss the deadline."""
        if sigma <= 1 or batch <= 1:
            return max(1, int(batch))
        a = min(self.fixed_s(), step_s)
        target = step_s / sigma
        if target <= a or step_s <= a:
            return max(1, int(batch))
        return max(1, int(batch * (target - a) / (step_s - a)))


def _intercept(rows: list[tuple[float, float, float]]) -> float:
    if len(rows) < 4:
        return 0.0
    # normal equations for y = a + b x1 + c x2
    n = len(rows)
    sx1 = sum(r[0] for r in rows); sx2 = sum(r[1] for r in rows); sy = sum(r[2] for r in rows)  # noqa: E702
    s11 = sum(r[0] * r[0] for r in rows); s22 = sum(r[1] * r[1] for r in rows); s12 = sum(r[0] * r[1] for r in rows)  # noqa: E702
    s1y = sum(r[0] * r[2] for r in rows); s2y = sum(r[1] * r[2] for r in rows)  # noqa: E702
    m = [[n, sx1, sx2, sy], [sx1, s11, s12, s1y], [sx2, s12, s22, s2y]]
    for col in range(3):                                  # Gauss-Jordan with partial pivoting
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return 0.0
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    a = m[0][3] / m[0][0]
    return a if math.isfinite(a) and a > 0 else 0.0
