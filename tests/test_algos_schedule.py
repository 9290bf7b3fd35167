import math

import pytest

from dora.algos.schedule import lr_at


def test_warmup_then_cosine_to_min():
    kw = dict(lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, **kw) == pytest.approx(1.0)
    assert lr_at(9, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(14, **kw) == pytest.approx(0.1) and lr_at(100, **kw) == pytest.approx(0.1)
    assert lr_at(50, lr=2.0) == 2.0
