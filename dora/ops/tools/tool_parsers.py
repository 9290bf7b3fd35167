"""Finding tool calls in the text of a finished model turn (the generate param `tool_parser`).

    hermes  <tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>
            (Hermes / Qwen style; `arguments` may also be a JSON string)
    tag     <NAME>BODY</NAME> for each declared tool NAME; BODY is the tool's main argument
            (python: code, search: query), e.g. <python>print(2**10)</python>
    stop    a turn that ends on one of the generate op's `stop` strings calls the one declared tool
            with the turn's text before it as the main argument (calculator style: "12*34=" -> 408)

Every call in the turn is returned in order; a malformed one (bad JSON, no name, an opening tag
never closed) is a MalformedCall whose error the model reads back as the observation. A turn with
neither ends the trajectory.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    error: str


Parsed = ToolCall | MalformedCall


class HermesParser:
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def __init__(self, main_args: Mapping[str, str], stop: list[str]):
        pass

    def parse(self, text: str) -> list[Parsed]:
        matches = list(self.CALL.finditer(text))
        out: list[Parsed] = [self._call(m.group(1)) for m in matches]
        if self.OPEN in text[matches[-1].end() if matches else 0:]:
            out.append(MalformedCall(f"{self.OPEN} without {self.CLOSE}: the call was not closed"))
        return out

    @staticmethod
    def _call(body: str) -> Parsed:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return MalformedCall(f"tool call is not valid JSON ({e.msg} at character {e.pos}): {body.strip()[:200]!r}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return MalformedCall('a tool call is {"name": <tool>, "arguments": {...}}, got ' + body.strip()[:200])
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                return MalformedCall(f"tool call arguments are a string that is not JSON ({e.msg})")
        if not isinstance(args, dict):
            return MalformedCall(f"tool call arguments must be an object, got {type(args).__name__}")
        return ToolCall(obj["name"], args)


class TagParser:
    def __init__(self, main_args: Mapping[str, str], stop: list[str]):
        self.main_args = dict(main_args)
        names = "|".join(re.escape(n) for n in sorted(self.main_args, key=len, reverse=True))
        self.call = re.compile(rf"<({names})>(.*?)</\1>", re.DOTALL) if names else None
        self.opening = re.compile(rf"<({names})>") if names else None

    def parse(self, text: str) -> list[Parsed]:
        if self.call is None:
            return []
        out: list[Parsed] = []
        end = 0
        for m in self.call.finditer(text):
            out.append(ToolCall(m.group(1), {self.main_args[m.group(1)]: m.group(2).strip("\n")}))
            end = m.end()
        unclosed = self.opening.search(text, end)
        if unclosed:
            out.append(MalformedCall(f"<{unclosed.group(1)}> without </{unclosed.group(1)}>: the call was not closed"))
        return out


class StopParser:
    def __init__(self, main_args: Mapping[str, str], stop: list[str]):
        problem = stop_parser_problem(list(main_args), stop)
        if problem:
            raise ValueError(problem)
        (self.tool, self.arg), = main_args.items()
        self.stop = sorted(stop, key=len, reverse=True)

    def parse(self, text: str) -> list[Parsed]:
        for s in self.stop:
            if text.endswith(s):
                return [ToolCall(self.tool, {self.arg: text[:-len(s)]})]
        return []


def stop_parser_problem(tools: list[str], stop: list[str]) -> str | None:
    if len(tools) != 1 or not stop:
        return (f"tool_parser stop calls the one declared tool when a turn ends on a `stop` string: it needs exactly "
                f"one tool and at least one stop string (tools: {tools}, stop: {stop})")
    return None


PARSERS = {"hermes": HermesParser, "tag": TagParser, "stop": StopParser}


def make_parser(name: str, main_args: Mapping[str, str], stop: list[str]) -> HermesParser | TagParser | StopParser:
    """A parser by name; `main_args`: tool name -> the argument a call's body fills; `stop`: the
    generate op's stop strings."""
    return PARSERS[name](main_args, stop)
