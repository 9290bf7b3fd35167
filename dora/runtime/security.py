"""ZeroMQ CURVE for runs whose sockets leave the machine (multi-node Ray): every dora socket of the
run encrypts, and a server socket accepts only the run's own client key.

The controller makes one set of keys per run (`RunKeys.generate()`) and hands them to each worker
when it starts it (Ray's actor arguments; never over a dora socket). Every process of the run calls
`install(keys)` before it makes a socket; `bind_router` and `connect_dealer` (channel.py) and the
worker's control sockets then secure themselves. On one machine (127.0.0.1, ipc://) nothing is
installed and sockets are plain, as before.
"""

from __future__ import annotations

import dataclasses
import threading

import zmq


@dataclasses.dataclass(frozen=True)
class RunKeys:
    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @staticmethod
    def generate() -> "RunKeys":
        sp, ss = zmq.curve_keypair()
        cp, cs = zmq.curve_keypair()
        return RunKeys(sp.decode(), ss.decode(), cp.decode(), cs.decode())

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


_keys: RunKeys | None = None
_authenticated: dict[int, object] = {}    # id(context) -> its ZAP authenticator thread
_lock = threading.Lock()


def install(keys: RunKeys | dict | None) -> None:
    """Secure every socket this process makes from now on (None: plain sockets)."""
    global _keys
    _keys = RunKeys(**keys) if isinstance(keys, dict) else keys


def installed() -> RunKeys | None:
    return _keys


def server(sock: zmq.Socket) -> None:
    """A socket that binds: CURVE server, accepting only the run's client key."""
    if _keys is None:
        return
    _authenticator(sock.context)
    sock.curve_secretkey = _keys.server_secret.encode()
    sock.curve_publickey = _keys.server_public.encode()
    sock.curve_server = True
    sock.zap_domain = b"dora"


def client(sock: zmq.Socket) -> None:
    """A socket that connects: CURVE client of the run's servers."""
    if _keys is None:
        return
    sock.curve_serverkey = _keys.server_public.encode()
    sock.curve_publickey = _keys.client_public.encode()
    sock.curve_secretkey = _keys.client_secret.encode()


class _OnlyThisRun:
    def __init__(self, key: str):
        self.key = key.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        from zmq.utils import z85

        return z85.encode(key) == self.key if len(key) == 32 else key == self.key


def release(ctx: zmq.Context) -> None:
    """Stop the context's ZAP handler (before ctx.term(), which would otherwise wait for it)."""
    with _lock:
        auth = _authenticated.pop(id(ctx), None)
    if auth is not None:
        auth.stop()


def _authenticator(ctx: zmq.Context) -> None:
    """One ZAP handler per context (what checks each client's key during the CURVE handshake)."""
    with _lock:
        if id(ctx) in _authenticated:
            return
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve_callback(domain="dora", credentials_provider=_OnlyThisRun(_keys.client_public))
        _authenticated[id(ctx)] = auth
