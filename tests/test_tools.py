"""Tool-call parsers, the search tool (BM25 over the shipped corpus), tool declarations and their
checks, and the runner that turns every failure into a counted error observation."""

from __future__ import annotations

import math
import time

import pytest

from dora.ops.tools.bm25 import BM25
from dora.ops.tools.search_tool import SearchTool
from dora.ops.tools.tool_base import Tool, ToolResult
from dora.ops.tools.tool_parsers import MalformedCall, ToolCall, make_parser
from dora.ops.tools.tool_registry import build_tools, tools_problems
from dora.ops.tools.tool_runner import ToolRunner

ARGS = {"python": "code", "search": "query"}


def test_hermes_parser_calls_and_malformed_calls():
    p = make_parser("hermes", ARGS, [])
    text = ('I will compute. <tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call> and '
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"iron\\"}"}</tool_call>')
    assert p.parse(text) == [ToolCall("python", {"code": "print(2**10)"}), ToolCall("search", {"query": "iron"})]
    assert p.parse("no call here") == []
    bad = p.parse('<tool_call>{"name": "python", "arguments": {"code": 1</tool_call>')
    assert len(bad) == 1 and isinstance(bad[0], MalformedCall) and "not valid JSON" in bad[0].error
    assert "arguments must be an object" in p.parse('<tool_call>{"name": "x", "arguments": [1]}</tool_call>')[0].error
    assert '"name"' in p.parse('<tool_call>{"arguments": {}}</tool_call>')[0].error
    unclosed = p.parse('<tool_call>{"name": "python", "arguments": {}}</tool_call> then <tool_call>{"name"')
    assert isinstance(unclosed[0], ToolCall) and "not closed" in unclosed[1].error


def test_tag_and_stop_parsers():
    p = make_parser("tag", ARGS, [])
    assert p.parse("Let me see: <python>\nprint(12*34)\n</python> then <search>iron</search>") == [
        ToolCall("python", {"code": "print(12*34)"}), ToolCall("search", {"query": "iron"})]
    assert p.parse("<pythonx>1</pythonx> <other>2</other>") == []
    assert "<python> without </python>" in p.parse("<python>print(1)")[0].error
    s = make_parser("stop", {"python": "code"}, ["="])
    assert s.parse("12*34=") == [ToolCall("python", {"code": "12*34"})] and s.parse("12*34") == []
    with pytest.raises(ValueError, match="exactly one tool"):
        make_parser("stop", ARGS, ["="])


def test_bm25_scores_by_hand_and_search_tool():
    docs = ["iron is a metal", "copper is a metal", "neon is a gas"]
    idx = BM25(docs, k1=1.5, b=0.75)
    # "iron": one document of three holds it, every document has 4 terms (avgdl 4: the length norm is 1)
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    assert idx.scores("iron") == pytest.approx([idf * 1 * 2.5 / (1 + 1.5), 0.0, 0.0])
    assert [i for i, _ in idx.top("metal gas", 3)][0] == 2 and idx.top("zinc", 3) == []
    t = SearchTool("search", corpus=None, top_k=2, max_output_chars=2000)
    r = t.run({"query": "ferrum atomic weight"})
    assert not r.error and r.text.startswith("[Iron (Fe)]") and "55.845" in r.text.splitlines()[0]
    assert t.run({"query": "qwertyuiop"}).text.startswith("No document matches")
    assert t.run({"q": "iron"}).error


def test_declarations_checked_with_keys_that_locate_them(tmp_path):
    bad_corpus = tmp_path / "c.jsonl"
    bad_corpus.write_text('{"id": "a", "title": "A", "text": "t"}\nnot json\n')
    problems = dict(tools_problems([
        {"name": "python", "timeout_s": 0.0},
        {"name": "pyhton"},
        {"name": "calc", "kind": "python", "memroy_mb": 64},
        {"name": "search", "corpus": str(bad_corpus)},
        {"name": "python"},
        "search",
    ]))
    assert "timeout_s" in problems["tools.0.timeout_s"] and ">= 0.1" in problems["tools.0.timeout_s"]
    assert "did you mean 'python'" in problems["tools.1.name"]
    assert "did you mean 'memory_mb'" in problems["tools.2.memroy_mb"]
    assert f"{bad_corpus}:2: not JSON" in problems["tools.3.corpus"]
    assert "declared twice" in problems["tools.4.name"]
    assert "a tool is declared as" in problems["tools.5"]
    assert tools_problems("python") == [("tools", "tools must be a list of {name: ..., <settings>}, got 'python'")]
    tools = build_tools([{"name": "calc", "kind": "python", "timeout_s": 2}, {"name": "search"}])
    assert tools["calc"].limits.wall_s == 2.0 and tools["calc"].limits.memory_mb == 256 and tools["search"].cfg["top_k"] == 3


class Flaky(Tool):
    kind, main_arg = "flaky", "x"

    def run(self, arguments):
        if arguments["x"] == "boom":
            raise RuntimeError("bug in the tool")
        time.sleep(0.05)
        return ToolResult(f"got {arguments['x']}", error=arguments["x"] == "bad")


def test_runner_never_raises_and_counts_errors():
    runner = ToolRunner({"flaky": Flaky("flaky")}, workers=2, max_calls=4)
    runner.submit("a", [ToolCall("flaky", {"x": "1"}), MalformedCall("not valid JSON"), ToolCall("nope", {}),
                        ToolCall("flaky", {"x": "boom"}), ToolCall("flaky", {"x": "2"})])
    runner.submit("b", [ToolCall("flaky", {"x": "bad"})])
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got.update(runner.ready(block_s=0.05))
    runner.close()
    a, b = got["a"], got["b"]
    assert a.text.splitlines() == ["got 1", "Error: not valid JSON", "Error: unknown tool 'nope' (tools: flaky)",
                                   "Error: tool 'flaky' failed: RuntimeError: bug in the tool",
                                   "Error: 1 more tool calls were not run (at most 4 per turn)"]
    assert (a.calls, a.errors) == (5, 4) and a.seconds >= 0.05
    assert (b.text, b.calls, b.errors) == ("got bad", 1, 1)
    again = ToolRunner({"flaky": Flaky("flaky")}, workers=1, max_calls=1)
    again.submit("a", [ToolCall("flaky", {"x": "1"})])
    with pytest.raises(ValueError, match="already"):
        again.submit("a", [])
    again.close()
