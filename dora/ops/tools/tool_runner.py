"""Runs the tool calls of model turns on a thread pool, so the engine keeps decoding other requests
while a tool works. One job per turn: its calls run in order and their results are joined into one
observation text. Nothing a call does raises out of here: a malformed call, an unknown tool, calls
past `max_calls`, a tool error and even a bug in a tool all become "Error: ..." lines, counted.
The caller polls `ready()` (and may block briefly in it when it has nothing else to do)."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from typing import Any

from dora.ops.tools.tool_base import Tool
from dora.ops.tools.tool_parsers import MalformedCall, Parsed, ToolCall


@dataclasses.dataclass(frozen=True)
class TurnOutcome:
    text: str          # the observation text (before the observation template)
    calls: int         # calls the turn made, malformed ones included
    errors: int        # of which failed
    seconds: float     # from submit to the last result: what the trajectory waited


def call_to_dict(c: Parsed) -> dict[str, Any]:
    """A parsed call as plain data (it travels in an exported request's meta)."""
    return {"error": c.error} if isinstance(c, MalformedCall) else {"name": c.name, "arguments": c.arguments}


def call_from_dict(d: dict[str, Any]) -> Parsed:
    return MalformedCall(d["error"]) if "error" in d else ToolCall(d["name"], dict(d["arguments"]))


class ToolRunner:
    def __init__(self, tools: dict[str, Tool], workers: int, max_calls: int):
        self.tools, self.max_calls = tools, max_calls
        self.pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dora-tool")
        self.jobs: dict[str, cf.Future] = {}

    def submit(self, key: str, calls: list[Parsed]) -> None:
        if key in self.jobs:
            raise ValueError(f"tool runner: {key!r} already has calls running")
        t0 = time.perf_counter()
        self.jobs[key] = self.pool.submit(self._run_turn, list(calls), t0)

    def ready(self, block_s: float = 0.0) -> list[tuple[str, TurnOutcome]]:
        """The jobs that finished (removed from here); waits up to block_s for the first one when none has."""
        if block_s > 0 and self.jobs and not any(f.done() for f in self.jobs.values()):
            cf.wait(list(self.jobs.values()), timeout=block_s, return_when=cf.FIRST_COMPLETED)
        done = [k for k, f in self.jobs.items() if f.done()]
        return [(k, self.jobs.pop(k).result()) for k in done]

    def take(self, key: str) -> TurnOutcome | None:
        """The outcome of `key` if it finished, and forget the job either way (a job still running
        is left to end on its own; its result is dropped)."""
        f = self.jobs.pop(key, None)
        return f.result() if f is not None and f.done() else None

    @property
    def pending(self) -> int:
        return len(self.jobs)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ in a pool thread
    def _run_turn(self, calls: list[Parsed], t0: float) -> TurnOutcome:
        texts, errors = [], 0
        for c in calls[:self.max_calls]:
            text, failed = self._run_call(c)
            texts.append(text)
            errors += failed
        if len(calls) > self.max_calls:
            texts.append(f"Error: {len(calls) - self.max_calls} more tool calls were not run "
                         f"(at most {self.max_calls} per turn)")
            errors += len(calls) - self.max_calls
        return TurnOutcome("\n".join(texts), len(calls), errors, time.perf_counter() - t0)

    def _run_call(self, c: Parsed) -> tuple[str, bool]:
        if isinstance(c, MalformedCall):
            return f"Error: {c.error}", True
        tool = self.tools.get(c.name)
        if tool is None:
            return f"Error: unknown tool {c.name!r} (tools: {', '.join(self.tools)})", True
        try:
            r = tool.run(c.arguments)
        except Exception as e:   # a bug in a tool is the tool's error, never the rollout's crash
            return f"Error: tool {c.name!r} failed: {type(e).__name__}: {e}"[:1000], True
        return r.text, r.error
