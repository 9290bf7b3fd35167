"""The http judge's client mechanics against a local OpenAI-style server (standard library, in this
process): at most `concurrency` requests open, a timeout counted and retried, a 5xx retried, a 4xx not,
an unreachable server failing start-up within start_timeout_s naming its URL. The same client against a
real `vllm serve`: tests/test_judge_vllm_serve.py."""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest

from dora.ops.judge.judge_op import JudgeError, JudgeOp
from op_context import op_context


class Server:
    """GET /v1/models; POST /v1/completions answers "7" after what the response text asks: SLOW (sleep
    past the timeout), E500 (a 500 on the first two tries), E400 (always 400)."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.open, self.max_open, self.tries = delay_s, 0, 0, collections.Counter()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:   # (the client gave up on it: a timeout)
                    pass

            def do_GET(self):
                self._reply(200, {"object": "list", "data": [{"id": "judge-m", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["prompt"]
                with outer.lock:
                    outer.open += 1
                    outer.max_open = max(outer.max_open, outer.open)
                    outer.tries[prompt] += 1
                    tries = outer.tries[prompt]
                try:
                    time.sleep(outer.delay_s + (2.0 if "SLOW" in prompt else 0.0))
                    if "E400" in prompt:
                        return self._reply(400, {"error": "bad request"})
                    if "E500" in prompt and tries <= 2:
                        return self._reply(500, {"error": "busy"})
                    self._reply(200, {"choices": [{"text": " 7", "index": 0}], "model": body["model"]})
                finally:
                    with outer.lock:
                        outer.open -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def judge(url: str, events: list, **params) -> JudgeOp:
    op = JudgeOp()
    op.setup(op_context("judge", {"engine": "http", "url": url, "rubric": "Rate: {response}", "timeout_s": 0.5,
                                  "retries": 2, "start_timeout_s": 2.0, **params}, report=events.append))
    return op


def run(op: JudgeOp, texts: list[str]) -> dict[str, float]:
    batch = pa.RecordBatch.from_pydict({"uid": [f"u{i}" for i in range(len(texts))], "group_id": list(range(len(texts))),
                                        "response_text": texts})
    op.process(batch, "trajectories")
    out = {}
    deadline = time.monotonic() + 30
    while op.busy() and time.monotonic() < deadline:
        for b in op.poll():
            out.update(zip(b.column("uid").to_pylist(), b.column("reward").to_pylist()))
    assert not op.busy()
    return out


def test_concurrency_is_bounded_and_failures_follow_on_error():
    server = Server(delay_s=0.2)
    try:
        events: list = []
        op = judge(server.url, events, concurrency=3)
        texts = ["fine"] * 9 + ["SLOW", "E500", "E400"]
        scores = run(op, texts)
        assert server.max_open == 3                                   # never more than `concurrency` at once
        assert [scores[f"u{i}"] for i in range(9)] == pytest.approx([0.7] * 9)
        assert scores["u10"] == pytest.approx(0.7)                    # a 500, twice, then an answer: retried
        assert scores["u9"] == scores["u11"] == 0.0                   # on_error zero
        assert server.tries["Rate: SLOW"] == 3 and server.tries["Rate: E400"] == 1   # a 4xx is not retried
        errs = [e for e in events if e["kind"] == "judge_errors"]
        assert sum(e["timeouts"] for e in errs) == 1 and sum(e["server_errors"] for e in errs) == 1
        assert op.stats()["http_retries"] == 2 + 2 and op.stats()["timeouts"] == 1
        op.teardown()
        op = judge(server.url, [], on_error="fail", retries=0)
        with pytest.raises(JudgeError, match="u0.*HTTP 400"):
            run(op, ["E400"])
        op.teardown()
    finally:
        server.close()


def test_an_unreachable_judge_fails_start_up_naming_its_url():
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=f"judge\\[0\\]: the judge at {url} is unreachable after 2 s"):
        judge(url, [])
    assert time.monotonic() - t0 < 4.0
