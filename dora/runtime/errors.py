"""Errors the runtime raises. Each names where it happened (edge and sender, node and replica)."""

from __future__ import annotations


class WireError(ValueError):
    """A message on a data or control channel that fails the wire checks.

    The receiver rejects it, counts it and keeps running; `edge` and `sender` say where it
    claimed to come from ("?" when the header itself was unreadable).
    """

    def __init__(self, message: str, edge: str = "?", sender: str = "?"):
        self.edge = edge
        self.sender = sender
        super().__init__(f"rejected message on edge {edge!r} from {sender!r}: {message}")


class RunFailed(RuntimeError):
    """The run ended early: a worker raised, died, froze, or a deadline passed. `bad_input`: what it
    raised names the user's input (a data file's row): the CLI exits 2, as for a bad pipeline."""

    def __init__(self, message: str, node: str | None = None, replica: int | None = None, traceback: str | None = None,
                 bad_input: bool = False):
        self.node = node
        self.replica = replica
        self.traceback = traceback
        self.bad_input = bad_input
        text = message if traceback is None else f"{message}\n--- traceback from {node}[{replica}] ---\n{traceback.rstrip()}"
        super().__init__(text)


class CallError(RuntimeError):
    """A control call (`Controller.call`) that the op refused or raised on; the run goes on."""

    def __init__(self, node: str, replica: int, method: str, error: str, traceback: str | None = None):
        self.node, self.replica, self.method, self.error, self.traceback = node, replica, method, error, traceback
        super().__init__(f"{node}[{replica}].{method}() failed: {error}" + (f"\n{traceback.rstrip()}" if traceback else ""))


class ReplicaLost(RuntimeError):
    """A control call whose replica died (or raised, froze, stalled) before it answered; the run goes
    on: the run controller respawns the replica and the driver reissues what it held."""

    def __init__(self, label: str, why: str):
        self.label, self.why = label, why
        super().__init__(f"{label} was lost: {why}")


class PlacementError(ValueError):
    """A graph that cannot be placed on its pools (names the node and pool)."""
