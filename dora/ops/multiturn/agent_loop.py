"""The generate op's multi-turn loop (generate params max_turns > 1 and `tools`).

A trajectory (dora/ops/multiturn/trajectory.py) alternates model turns on the engine and tool calls
on a thread pool (dora/ops/tools/tool_runner.py), so while a tool runs the engine decodes other
requests and the waiting trajectory holds no decode slot. Per trajectory:
    model turn (engine request) -> finished: parse the turn's text for tool calls
      no call: done (finish_reason of the turn)
      calls, but max_turns / max_total_tokens reached: done, "length"
      calls: run them off the engine loop -> observation text -> observation template ->
             tokenized and appended (mask 0, logprob 0) -> next model turn
A turn that ends on its token limit ends the trajectory with "length".

The trajectory's state rides in each request's meta ({"row", "traj"}), so a request exported
mid-turn resumes anywhere. A trajectory waiting on a tool is exported as a SequenceState with no
KV and meta["tool_wait"]: the observation when its tool already finished, else the parsed calls,
which the importing replica runs again (the sandboxed tools have no side effects that persist).

KV parking (param park_kv, the torch engine): every turn is submitted with keep_kv, so when it
finishes the engine parks its KV (it holds no decode slot, its blocks count against the KV pool);
the next turn continues the same uid and prefills only the observation. When the pool runs short
the engine drops parked KV oldest first; that continuation is prefilled in full and counted
(engine stats parked_dropped, continuation_reprefill_tokens). The parked KV is released when the
trajectory ends, is aborted, or leaves the replica while waiting on a tool (the importer
prefills its context again, counted the same way). park_kv false: every turn prefills its whole
context (the prefix cache may still find its full blocks).
Contract: docs/architecture.md, "Tools and multi-turn rollouts".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.ops.engines.engine import Completion, Engine, SamplingRequest, SequenceState
from dora.ops.eval_data import eval_sampling
from dora.ops.multiturn.trajectory import Trajectory
from dora.ops.tools.tool_parsers import Parsed, make_parser
from dora.ops.tools.tool_registry import build_tools
from dora.ops.tools.tool_runner import ToolRunner, TurnOutcome, call_from_dict, call_to_dict

# With nothing to decode, one poll waits this long for a tool to finish (the worker keeps serving
# control messages between polls instead of spinning).
IDLE_WAIT_S = 0.05


@dataclasses.dataclass
class _Wait:
    traj: Trajectory
    row: dict[str, Any]
    version: int
    calls: list[Parsed]


class AgentLoop:
    def __init__(self, engine: Engine, tokenizer, params: dict[str, Any], stop_ids: list[int]):
        self.engine, self.tokenizer = engine, tokenizer
        self.tools = build_tools(params["tools"])
        self.parser = make_parser(params["tool_parser"], {n: t.main_arg for n, t in self.tools.items()}, params["stop"])
        self.runner = ToolRunner(self.tools, params["tool_workers"], params["max_tool_calls"])
        self.template = params["observation_template"]
        self.max_turns, self.max_total_tokens, self.max_tokens = params["max_turns"], params["max_total_tokens"], params["max_tokens"]
        self.sampling = {k: params[k] for k in ("temperature", "top_p", "top_k")}
        self.stop_ids = list(stop_ids)
        self.park = bool(params["park_kv"])
        self.waiting: dict[str, _Wait] = {}      # uid -> a trajectory whose tool calls are running
        self.finished: list[Completion] = []      # trajectories that ended outside a poll (an import)

    # ------------------------------------------------------------------ driving
    def start(self, uid: str, prompt_ids: list[int], version: int, row: dict[str, Any]) -> None:
        limit = self.max_total_tokens
        seq_len = getattr(self.engine, "max_seq_len", None)   # the engine ends a request at its context length
        if seq_len:
            limit = max(1, min(limit, int(seq_len) - len(prompt_ids)))
        self._submit(uid, Trajectory(list(prompt_ids), self.max_turns, limit), row, version)

    def advance(self, completions: list[Completion]) -> list[Completion]:
        """Take the engine's finished turns and the tools' finished calls; return ended trajectories."""
        out, self.finished = self.finished, []
        for c in completions:
            out += self._on_turn(c)
        idle = not out and not self.engine.has_work()
        for uid, outcome in self.runner.ready(IDLE_WAIT_S if idle else 0.0):
            out += self._on_observation(uid, outcome)
        return out

    def has_work(self) -> bool:
        return bool(self.waiting or self.finished)

    def waiting_versions(self) -> set[int]:
        """Versions of the trajectories waiting on a tool: their next turn runs on that version, so
        the engine keeps it hosted (Engine.keep_versions)."""
        return {w.version for w in self.waiting.values()}

    def _on_turn(self, c: Completion) -> list[Completion]:
        row, traj = c.meta["row"], Trajectory.from_dict(c.meta["traj"])
        traj.add_model_turn(c.response_ids, c.logprobs, c.token_versions)
        if c.finish_reason != "stop":
            return self._end(c.uid, traj, row, c.version, "length")
        calls = self.parser.parse(self.tokenizer.decode(c.response_ids, skip_special_tokens=True))
        if not calls:
            return self._end(c.uid, traj, row, c.version, "stop")
        if traj.turns >= traj.max_turns or traj.room < 2:   # no room for an observation and a reply
            return self._end(c.uid, traj, row, c.version, "length")
        self.runner.submit(c.uid, calls)
        self.waiting[c.uid] = _Wait(traj, row, c.version, calls)
        return []

    def _on_observation(self, uid: str, outcome: TurnOutcome) -> list[Completion]:
        w = self.waiting.pop(uid, None)
        if w is None:   # aborted or exported while its tool ran
            return []
        ids = self.tokenizer.encode(self.template.replace("{observation}", outcome.text), add_special_tokens=False)
        if w.traj.add_observation(ids, wait_s=outcome.seconds, calls=outcome.calls, errors=outcome.errors):
            self._submit(uid, w.traj, w.row, w.version)
            return []
        return self._end(uid, w.traj, w.row, w.version, w.traj.finish_reason)

    # ------------------------------------------------------------------ the engine requests (one place)
    def _request(self, uid: str, traj: Trajectory, row: dict[str, Any], version: int,
                 extra_meta: dict[str, Any] | None = None) -> SamplingRequest:
        s = eval_sampling(row, {**self.sampling, "max_tokens": self.max_tokens})   # (a held-out set's own)
        return SamplingRequest(uid=uid, prompt_ids=traj.context(), version=version,
                               max_tokens=max(1, min(s.pop("max_tokens"), traj.room)), stop_ids=self.stop_ids,
                               meta={"row": row, "traj": traj.to_dict(), **(extra_meta or {})},
                               keep_kv=self.park, continues=uid if self.park and traj.turns else None, **s)

    def _submit(self, uid: str, traj: Trajectory, row: dict[str, Any], version: int) -> None:
        self.engine.submit(self._request(uid, traj, row, version))

    def _release(self, uid: str) -> None:
        """The trajectory ended or left: its parked KV (if the engine still holds it) goes."""
        if self.park:
            self.engine.release(uid)

    def _end(self, uid: str, traj: Trajectory, row: dict[str, Any], version: int, reason: str) -> list[Completion]:
        traj.finish(reason)
        traj.check()
        self._release(uid)
        return [Completion(uid, traj.prompt_ids, traj.tokens, traj.logprobs, traj.versions, version, reason,
                           {"row": row, "traj": traj.to_dict()})]

    # ------------------------------------------------------------------ moving requests
    def export(self, uids: list[str]) -> list[SequenceState]:
        """Remove these trajectories (mid-turn on the engine, or waiting on a tool) and return their
        state. One that has just ended (emitted at the next poll) is not exported."""
        ended = {c.uid for c in self.finished}
        states = self.engine.export([u for u in uids if u not in self.waiting and u not in ended])
        return states + [self._wait_state(u) for u in uids if u in self.waiting]

    def interrupt_all(self) -> list[SequenceState]:
        return self.engine.interrupt_all() + [self._wait_state(u) for u in list(self.waiting)]

    def import_(self, states: list[SequenceState]) -> None:
        self.engine.import_([s for s in states if "tool_wait" not in s.request.meta])
        for s in states:
            if "tool_wait" in s.request.meta:
                self._resume_wait(s)

    def abort(self, uid: str) -> bool:
        if uid in self.waiting:
            del self.waiting[uid]
            self.runner.take(uid)
            self._release(uid)
            return True
        if any(c.uid == uid for c in self.finished):
            self.finished = [c for c in self.finished if c.uid != uid]
            return True
        return self.engine.abort(uid) is not None

    def _wait_state(self, uid: str) -> SequenceState:
        w = self.waiting.pop(uid)
        outcome = self.runner.take(uid)
        self._release(uid)   # the KV stays behind: the importer prefills the context again
        wait = ({"outcome": dataclasses.asdict(outcome)} if outcome is not None
                else {"calls": [call_to_dict(c) for c in w.calls]})
        return SequenceState(self._request(uid, w.traj, w.row, w.version, {"tool_wait": wait}), [], [], [])

    def _resume_wait(self, s: SequenceState) -> None:
        meta, uid = s.request.meta, s.request.uid
        traj = Trajectory.from_dict(meta["traj"])
        calls = [call_from_dict(d) for d in meta["tool_wait"].get("calls", [])]
        self.waiting[uid] = _Wait(traj, meta["row"], s.request.version, calls)
        if "outcome" in meta["tool_wait"]:
            self.finished += self._on_observation(uid, TurnOutcome(**meta["tool_wait"]["outcome"]))
        else:
            self.runner.submit(uid, calls)

    def tool_failures(self) -> dict[str, int]:
        """Failed tool calls by kind (timeout, output, refused, ...), summed over the tools."""
        out: dict[str, int] = {}
        for tool in self.tools.values():
            for kind, n in tool.stats().items():
                out[kind] = out.get(kind, 0) + n
        return out

    def close(self) -> None:
        self.runner.close()
        for tool in self.tools.values():
            tool.close()


def trajectory_columns(c: Completion, tokenizer) -> dict[str, Any]:
    """The multi-turn columns of an ended trajectory's row (types: dora/graph/columns.py)."""
    traj = Trajectory.from_dict(c.meta["traj"])
    return {"response_mask": traj.mask, "final_turn_text": tokenizer.decode(traj.final_turn(), skip_special_tokens=True),
            "turns": traj.turns, "tool_calls": traj.tool_calls, "tool_errors": traj.tool_errors,
            "tool_wait_s": traj.tool_wait_s}


def event_fields(cs: list[Completion]) -> dict[str, list]:
    """Per-trajectory lists for the generate op's `finished` event: turns, tool_calls, tool_errors,
    tool_wait_s, `turn_trace` ([[generated tokens, tool wait s, observation tokens], ...] per
    trajectory, the simulator's trace format) with `prompt_tokens`, and `context_prefill_tokens`:
    the context each later turn prefilled again (all of it but the new observation), which an
    engine that parks KV across a tool wait would not."""
    trajs = [c.meta["traj"] for c in cs]
    return {"turns": [len(t["turn_log"]) for t in trajs], "tool_calls": [t["tool_calls"] for t in trajs],
            "tool_errors": [t["tool_errors"] for t in trajs],
            "tool_wait_s": [float(sum(x[1] for x in t["turn_log"])) for t in trajs],
            "turn_trace": [t["turn_log"] for t in trajs], "prompt_tokens": [len(t["prompt_ids"]) for t in trajs],
            "context_prefill_tokens": [context_prefill(len(t["prompt_ids"]), t["turn_log"]) for t in trajs]}


def context_prefill(prompt_tokens: int, turn_log: list[list]) -> int:
    """Tokens prefilled again by the continuations of one trajectory: before turn k (k >= 2), the
    prompt and every token up to the end of turn k-1's model tokens."""
    total, seen = 0, prompt_tokens
    for generated, _, observed in turn_log[:-1]:
        seen += int(generated)
        total += seen
        seen += int(observed)
    return total
