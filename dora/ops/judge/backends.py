"""Who answers a judge's rubric: the project's own generation engines with the judge's own model.

A backend takes (uid, row) and gives back, from `poll()`, (uid, verdict text) or (uid, a
JudgeFailure). `EngineJudge` runs the torch or vllm engine (dora/ops/engines, built as the
generate op builds one, make_engine) on the judge's model: the `model` param, or the pipeline's
model section when null (the initial policy, frozen: no weights edge reaches a judge). Requests
of one batch are submitted together, so the rubric's shared head (rubric.Rubric.head_ids) is
prefilled once and the others find it in the prefix cache. The remote judge is http_judge.py.
"""

from __future__ import annotations

from typing import Any

from dora.ops.base import OpContext
from dora.ops.judge.rubric import Rubric

SAMPLING = ("temperature", "top_p", "top_k", "max_tokens")


class JudgeFailure(Exception):
    """A row the judge could not answer. kind: "timeout" or "server" (an error from the judge itself)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class EngineJudge:
    def __init__(self, ctx: OpContext, params: dict[str, Any]):
        from dora.ops.engines.engine import SamplingRequest   # (here: the http judge and dora validate import no torch)
        from dora.ops.generate import make_engine

        model = params["model"] if params["model"] is not None else ctx.model
        # a judge's weights never change: one version, sampled with its own seed per replica
        self.engine, self.tokenizer = make_engine(params, model, device=ctx.device, model_seed=ctx.seed,
                                                  sample_seed=ctx.seed * 1000 + 500 + ctx.replica, run_dir=ctx.run_dir,
                                                  label=ctx.label, devices=ctx.devices, memory=ctx.memory)
        self.rubric = Rubric(params["rubric"], self.tokenizer, chat=params["chat"])
        self.sampling = {k: params[k] for k in SAMPLING}
        self.context = getattr(self.engine, "max_seq_len", None) or getattr(self.engine, "max_model_len", None)
        self.refused: list[tuple[str, JudgeFailure]] = []
        self.request = SamplingRequest

    def submit(self, uid: str, row: dict[str, Any]) -> None:
        ids = self.rubric.ids(row)
        if self.context and len(ids) + self.sampling["max_tokens"] > self.context:
            # (never truncated: a verdict on part of a response is not a verdict on it)
            self.refused.append((uid, JudgeFailure("server", f"the rubric filled for {uid} is {len(ids)} tokens; with "
                                                             f"max_tokens {self.sampling['max_tokens']} it exceeds the "
                                                             f"judge's context of {self.context}")))
            return
        self.engine.submit(self.request(uid=uid, prompt_ids=ids, version=self.engine.version, **self.sampling))

    def poll(self) -> list[tuple[str, str | JudgeFailure]]:
        out: list[tuple[str, str | JudgeFailure]] = list(self.refused)
        self.refused.clear()
        if self.engine.has_work():
            out += [(c.uid, self.tokenizer.decode(c.response_ids, skip_special_tokens=True)) for c in self.engine.step()]
        return out

    def stats(self) -> dict[str, Any]:
        s = self.engine.stats()
        return {"prefill_tokens": s.prefill_tokens, "prefix_hit_tokens": s.prefix_hit_tokens,
                "generated_tokens": s.generated_tokens, "rubric_head_tokens": len(self.rubric.head_ids)}

    def close(self) -> None:
        self.engine.close()
