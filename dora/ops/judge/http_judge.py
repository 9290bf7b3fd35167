"""A judge served elsewhere, over the OpenAI-compatible HTTP API (what `vllm serve` exposes).

`url` is the API's base (http://HOST:PORT/v1). At start-up the judge asks `GET {url}/models`
until it answers or `start_timeout_s` passes, then fails naming the URL and the last error; with
`served_model` null it takes the first model the server lists. Each row is one request (`api`:
`completions` sends the filled rubric as the prompt; `chat` sends it as the user message and the
server applies its own chat template), run by a pool of `concurrency` threads, so at most that
many are open at once. A request waits at most `timeout_s` for the server; a timeout, a refused
connection, HTTP 429 or a 5xx is tried again up to `retries` times after a pause that doubles from
RETRY_PAUSE_S (capped at RETRY_PAUSE_MAX_S); another 4xx is not retried (the request itself is wrong).
Standard library only (urllib, json, concurrent.futures): no client package to install.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from dora.ops.judge.backends import SAMPLING, JudgeFailure
from dora.ops.judge.rubric import Rubric

RETRY_PAUSE_S = 0.2       # the first pause before a retry; doubled for each one after it
RETRY_PAUSE_MAX_S = 5.0
PROBE_EVERY_S = 1.0       # how often start-up asks a server that is not up yet
PROBE_TIMEOUT_S = 10.0    # one start-up probe's wait (a server that is up answers /models at once)
POLL_WAIT_S = 0.05        # poll() waits this long for an answer when none is ready (no busy spin)


def url_problem(url: Any) -> str | None:
    """Why `url` cannot be a judge's base URL (None: fine). Checked by `dora validate`."""
    if not isinstance(url, str) or not url:
        return "engine http needs url: the API's base, e.g. http://127.0.0.1:8000/v1"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url {url!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8000/v1)"
    try:
        parts.port
    except ValueError as e:
        return f"url {url!r}: {e}"
    if parts.query or parts.fragment:
        return f"url {url!r}: give the API's base, without a query or fragment"
    return None


class HttpJudge:
    def __init__(self, label: str, params: dict[str, Any]):
        self.label = label
        self.url = params["url"].rstrip("/")
        self.api, self.timeout_s, self.retries = params["api"], params["timeout_s"], params["retries"]
        self.sampling = {k: params[k] for k in SAMPLING}
        self.rubric = Rubric(params["rubric"], None, chat=False)   # the server applies any chat template
        self.model = self._probe(params["served_model"], params["start_timeout_s"])
        self.pool = cf.ThreadPoolExecutor(params["concurrency"], thread_name_prefix=f"{label}-http")
        self.futures: dict[cf.Future, str] = {}
        self.requests = self.retried = 0

    def _probe(self, wanted: str | None, start_timeout_s: float) -> str:
        """The model to ask: `wanted` if the server lists it, else (None) the first it lists. Asks
        `GET /models` until the server answers or start_timeout_s passes."""
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                listed = self._get("/models")
                break
            except (OSError, ValueError, AttributeError) as e:   # refused, unreachable, timed out, not JSON
                if time.monotonic() + PROBE_EVERY_S > deadline:
                    raise RuntimeError(f"{self.label}: the judge at {self.url} is unreachable after {start_timeout_s:g} s "
                                       f"(start_timeout_s): {type(e).__name__}: {e}") from None
                time.sleep(PROBE_EVERY_S)
        models = [str(m["id"]) for m in listed.get("data", []) if isinstance(m, dict) and "id" in m]
        if wanted is not None and wanted not in models:
            raise RuntimeError(f"{self.label}: the judge at {self.url} does not serve {wanted!r} (served_model); it "
                               f"serves {models}")
        if not models:
            raise RuntimeError(f"{self.label}: the judge at {self.url} lists no models: {str(listed)[:200]}")
        return wanted or models[0]

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=min(self.timeout_s, PROBE_TIMEOUT_S)) as r:
            listed = json.loads(r.read())
        if not isinstance(listed, dict):
            raise ValueError(f"GET {path} answered {str(listed)[:100]}, not a JSON object")
        return listed

    def submit(self, uid: str, row: dict[str, Any]) -> None:
        self.futures[self.pool.submit(self._ask, self.rubric.text(row))] = uid

    def poll(self) -> list[tuple[str, str | JudgeFailure]]:
        if not self.futures:
            return []
        done, _ = cf.wait(list(self.futures), timeout=POLL_WAIT_S, return_when=cf.FIRST_COMPLETED)
        out: list[tuple[str, str | JudgeFailure]] = []
        for f in done:
            uid = self.futures.pop(f)
            exc = f.exception()
            out.append((uid, exc if isinstance(exc, JudgeFailure) else
                        JudgeFailure("server", f"{type(exc).__name__}: {exc}") if exc else f.result()))
        return out

    def _ask(self, prompt: str) -> str:
        """The judge's text for one filled rubric, with retries; raises JudgeFailure."""
        body = {"model": self.model, **self.sampling}
        if body["top_k"] == 0:
            del body["top_k"]   # (0 means off here; OpenAI servers take -1 or nothing)
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        data = json.dumps(body).encode()
        failure = JudgeFailure("server", "not tried")
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
                time.sleep(min(RETRY_PAUSE_S * 2 ** (attempt - 1), RETRY_PAUSE_MAX_S))
            self.requests += 1
            try:
                return self._post(data)
            except JudgeFailure as e:
                failure = e
                if e.kind == "final":
                    raise JudgeFailure("server", str(e)) from None
        raise failure

    def _post(self, data: bytes) -> str:
        path = "/chat/completions" if self.api == "chat" else "/completions"
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode(errors="replace")
            kind = "server" if e.code == 429 or e.code >= 500 else "final"
            raise JudgeFailure(kind, f"HTTP {e.code} from {self.url}{path}: {detail}") from None
        except (TimeoutError, socket.timeout) as e:
            raise JudgeFailure("timeout", f"no answer from {self.url}{path} within {self.timeout_s:g} s") from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise JudgeFailure("timeout", f"no answer from {self.url}{path} within {self.timeout_s:g} s") from None
            raise JudgeFailure("server", f"{self.url}{path}: {e.reason}") from None
        except (OSError, ValueError) as e:   # reset connection, a reply that is not JSON
            raise JudgeFailure("server", f"{self.url}{path}: {type(e).__name__}: {e}") from None
        try:
            choice = reply["choices"][0]
            return str(choice["message"]["content"] if self.api == "chat" else choice["text"])
        except (KeyError, IndexError, TypeError):
            raise JudgeFailure("final", f"{self.url}{path} answered without choices: {str(reply)[:200]}") from None

    def stats(self) -> dict[str, Any]:
        return {"http_requests": self.requests, "http_retries": self.retried, "http_open": len(self.futures)}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
