"""Headless Chromium driven over the DevTools protocol (a websocket), for the browser tests.

    with Chromium() as b:                 # Debian's `chromium`; skips the test when it is missing
        b.open("http://127.0.0.1:8765/")
        b.eval("document.title")
        b.screenshot("page.png")
        b.errors                          # uncaught exceptions and console errors seen so far

Every wait has a deadline. The browser gets a fresh profile folder and no network beyond the
page it is pointed at (no background networking, component updates, sync or QUIC).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--window-size=1400,1900"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    def __init__(self, timeout_s: float = 30.0):
        exe = chromium_path()
        if exe is None:
            pytest.skip("chromium is not installed (.ci/setup installs Debian's chromium package)")
        websocket = pytest.importorskip("websocket", reason="websocket-client is in the test extra")
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="dora-chromium-")
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws = None
        self.ids = itertools.count(1)
        self.errors: list[str] = []
        try:
            port = self._devtools_port()
            targets = self._wait(lambda: [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5))
                                          if t.get("type") == "page"], "a page target")
            self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=timeout_s)
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _wait(self, fn, what: str):
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} while waiting for {what}")
            try:
                got = fn()
            except (OSError, ValueError):
                got = None
            if got:
                return got
            time.sleep(0.1)
        raise TimeoutError(f"chromium: no {what} within {self.timeout_s} s")

    def _devtools_port(self) -> int:
        path = os.path.join(self.profile, "DevToolsActivePort")

        def read():
            with open(path) as fh:
                first = fh.readline().strip()
            return int(first) if first.isdigit() else None
        return self._wait(read, "DevToolsActivePort file")

    def _note(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params") or {}
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails") or {}
            self.errors.append(f"exception: {(d.get('exception') or {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}")

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        cid = next(self.ids)
        self.ws.send(json.dumps({"id": cid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == cid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result") or {}
            self._note(msg)
        raise TimeoutError(f"chromium: no reply to {method} within {self.timeout_s} s")

    def open(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", what=f"{url} to load")

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluating {expression!r}: {r['exceptionDetails'].get('text')}")
        return (r.get("result") or {}).get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None, what: str | None = None) -> Any:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            got = self.eval(expression)
            if got:
                return got
            time.sleep(0.2)
        raise TimeoutError(f"chromium: {what or expression} not true within {timeout_s or self.timeout_s} s")

    def screenshot(self, path: str) -> str:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
