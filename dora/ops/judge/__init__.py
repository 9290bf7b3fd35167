"""The judge op: an LLM scores each trajectory by a rubric (dora/ops/judge/judge_op.py).

rubric.py    the rubric template ({prompt} {response} {answer}) and its shared prefix, tokenized once
verdicts.py  the judge's text -> a score: number in a range, yes/no, letter grade, or a regex
backends.py  who answers: the project's own engines (torch, vllm) with the judge's own model
http_judge.py  or a server speaking the OpenAI API (`vllm serve`), with bounded concurrency,
             a timeout and retries
checks.py    what `dora validate` checks of a judge node (no torch, no model loaded)
"""

from dora.ops.judge.judge_op import JudgeOp

__all__ = ["JudgeOp"]
