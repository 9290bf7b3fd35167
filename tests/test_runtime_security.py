"""CURVE on every socket of a secured run (what multi-node Ray runs use): the run works end to end,
and a client without the run's keys gets nothing through."""

from __future__ import annotations

import time

import zmq

from dora.runtime import security, wire
from dora.runtime.run_controller import Controller
from tests.runtime_graphs import pipeline, read_sink
from tests.test_runtime_dataflow import check_exactly_once


def test_secured_run_is_exactly_once_over_tcp(tmp_path):
    rows, g = 4_000, 4
    ctl = Controller(pipeline(rows, g, batch_rows=500), run_dir=str(tmp_path), deadline_s=120,
                     backend_options={"transport": "tcp"}, secure=True)
    res = ctl.run()
    assert res.ok and res.rejected == 0
    check_exactly_once(read_sink(str(tmp_path)), rows, g)
    assert security.installed() is None   # the keys leave with the run


def test_a_stranger_without_the_run_keys_gets_nothing_through():
    keys = security.RunKeys.generate()
    ctx = zmq.Context()
    try:
        security.install(keys)
        from dora.runtime.channel import bind_router, connect_dealer
        server, endpoint = bind_router(ctx, "127.0.0.1")
        friend = connect_dealer(ctx, endpoint, identity=b"friend")
        security.install(None)
        stranger = ctx.socket(zmq.DEALER)             # plain: no keys at all
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.connect(endpoint)
        impostor = ctx.socket(zmq.DEALER)             # knows the server key, but a key of its own
        impostor.setsockopt(zmq.LINGER, 0)
        pub, sec = zmq.curve_keypair()
        impostor.curve_serverkey, impostor.curve_publickey, impostor.curve_secretkey = keys.server_public.encode(), pub, sec
        impostor.connect(endpoint)
        for sock in (stranger, impostor, friend):
            sock.send(wire.encode_control({"kind": "hello", "pid": 1})[0])
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if server.poll(200):
                got.append(server.recv_multipart()[0])
        assert got == [b"friend"]
        for sock in (stranger, impostor, friend, server):
            sock.close(0)
    finally:
        security.install(None)
        security.release(ctx)
        ctx.term()
