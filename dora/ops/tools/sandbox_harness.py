"""The code_exec reward's test runner inside the sandbox (stdlib only; sandbox_child.py calls it
after confining itself). It runs the program against each case's input and writes one JSON line per
case to its results stream as soon as the case ends. The expected outputs never enter the sandbox:
the parent compares (dora/ops/tools/code_exec.py), so a program cannot read its answers.

payload {"kind": "tests", "program": str, "mode": "stdin" | "expr", "cases": [...],
         "case_timeout_s": float, "case_output_bytes": int}
- stdin: each case {"input": str}; the program runs afresh as __main__ with that input as its
  standard input (file descriptor 0, so input(), sys.stdin.buffer and open(0) all read it), and what
  it writes to file descriptor 1 is the case's result ("out").
- expr: the program runs once; each case {"expr": str, "args": list | absent} is evaluated in the
  program's namespace (and called with args when given); the repr of the value is the result ("value").
A line: {"case": i, "out" | "value": str, "error": str | null, "cut": bool} (cut: over
case_output_bytes). A case over case_timeout_s ends with error "timeout" (an interval timer raising
in the program); a program that blocks the timer is stopped by the sandbox's wall clock, and the
cases it never reached fail. Writing past the file-size limit fails the write (EFBIG), not the run.
"""

import builtins
import json
import os
import signal
import sys

CASE_IN, CASE_OUT = ".case_input", ".case_output"   # in the scratch folder (the working directory)


class CaseTimeout(BaseException):
    """Raised by the interval timer when a case runs past its limit (a BaseException, so a program's
    `except Exception` does not swallow it)."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


def run_tests(payload: dict) -> int:
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")   # the channel, kept apart from the program's fd 1
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    mode, cases = payload["mode"], payload["cases"]
    limit, cap = float(payload["case_timeout_s"]), int(payload["case_output_bytes"])
    try:
        code = compile(payload["program"], "<program>", "exec")
    except (SyntaxError, ValueError) as e:
        return _fail_all(results, len(cases), f"{type(e).__name__}: {e}")
    scope = None
    if mode == "expr":
        _redirect("")
        scope, error = _timed(lambda: _exec_main(code), limit)
        if error:
            return _fail_all(results, len(cases), "the program failed: " + error)
    for i, case in enumerate(cases):
        _redirect(str(case.get("input", "")))
        if mode == "stdin":
            value, error = _timed(lambda: _exec_main(code), limit)
        else:
            value, error = _timed(lambda: _evaluate(case, scope), limit)
        sys.stdout.flush()
        text = _read_output(cap + 1) if mode == "stdin" else _safe_repr(value, cap + 1)
        line = {"case": i, "error": error, "cut": len(text) > cap, ("out" if mode == "stdin" else "value"): text[:cap]}
        results.write(json.dumps(line) + "\n")
        results.flush()
    return 0


def _redirect(stdin_text: str) -> None:
    """A fresh standard input holding `stdin_text` and an empty standard output file, on fds 0 and 1."""
    for path, fd, data in ((CASE_IN, 0, stdin_text.encode("utf-8")), (CASE_OUT, 1, b"")):
        new = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(new, data)
        os.lseek(new, 0, os.SEEK_SET)
        if new != fd:   # the program may have closed fd 0 or 1, which os.open then reuses
            os.dup2(new, fd)
            os.close(new)
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)


def _read_output(limit: int) -> str:
    with open(CASE_OUT, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def _safe_repr(value, limit: int) -> str:
    try:
        return repr(value)[:limit]
    except BaseException as e:   # a value whose __repr__ fails
        return f"<unrepresentable: {type(e).__name__}>"


def _exec_main(code):
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(code, scope)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    return scope


def _evaluate(case: dict, scope: dict):
    value = eval(compile(str(case["expr"]), "<test>", "eval"), scope)
    if case.get("args") is not None:
        value = value(*case["args"])
    return value


def _timed(fn, limit: float):
    """(fn's value, None) or (None, what went wrong in one line), under the interval timer."""
    signal.signal(signal.SIGALRM, _on_alarm)   # again each case: a program may have replaced it
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            return fn(), None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CaseTimeout:
        return None, f"timeout (over {limit:g} s)"
    except BaseException as e:   # the program's error fails the case
        return None, f"{type(e).__name__}: {e}"[:300]


def _fail_all(results, n: int, error: str) -> int:
    for i in range(n):
        results.write(json.dumps({"case": i, "error": error[:300], "cut": False}) + "\n")
    results.flush()
    return 0
