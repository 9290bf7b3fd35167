"""Backends start and stop worker processes; everything else (wiring, control) is the controller's.

A backend implements:
    host: str                          address workers bind and the controller listens on
    start(launches: list[Launch])      start one worker per Launch (non-blocking)
    exited() -> list[(label, why)]     workers whose process/actor ended since the last call
    kill(label)                        end one worker now (before it is respawned)
    shutdown(timeout_s)                make sure every worker is gone (kill what is left)
"""

from __future__ import annotations

from dora.runtime.backends.launch_spec import Launch

__all__ = ["BACKENDS", "Launch", "get_backend"]

BACKENDS = ("local", "ray")


def get_backend(name: str, **options):
    if name == "local":
        from dora.runtime.backends.local import LocalBackend

        return LocalBackend(**options)
    if name == "ray":
        from dora.runtime.backends.ray import RayBackend

        return RayBackend(**options)
    raise ValueError(f"unknown backend {name!r} (choose one of {list(BACKENDS)})")
