"""Which policy versions a simulated instance holds weights for (async.versions_per_instance, M).

An instance hosts its current version (new requests are submitted on it) and the version of every
request still on it (running, queued or waiting on a tool): an older version's weights stay while
one of its requests is there and leave with the last one. Every hosted weight copy beyond the
first takes its bytes from the KV room; every version with a running request reads its weights in
each decode step (CostModel.decode_step_versions_s).
"""

from __future__ import annotations

import collections


class HostedVersions:
    def __init__(self, limit: int = 1):
        self.limit = limit                                   # M: at most this many versions at once
        self.current: int | None = None
        self.present: collections.Counter[int] = collections.Counter()   # version -> requests on the instance
        self.running: collections.Counter[int] = collections.Counter()   # version -> requests decoding now

    def hosted(self) -> set[int]:
        out = set(self.present)
        if self.current is not None:
            out.add(self.current)
        return out

    def count(self) -> int:
        return len(self.hosted())

    def holds(self, version: int) -> bool:
        return version == self.current or version in self.present

    def problem_loading(self, v: int) -> str | None:
        """Why `v` cannot become current now (None when it can). The current version's weights
        stay only while requests of it are here."""
        after = set(self.present) | {v}
        if self.limit == 1 and self.present:
            return (f"{sum(self.present.values())} requests still on it (export or interrupt them first; "
                    "versions_per_instance is 1)")
        if len(after) > self.limit:
            return f"it would host versions {sorted(after)}, more than versions_per_instance = {self.limit}"
        return None

    def switch_all(self, version: int) -> None:
        """Every request here now runs on `version`, the only version hosted (an in-flight swap)."""
        self.current = version
        self.present = collections.Counter({version: sum(self.present.values())} if self.present else {})
        self.running = collections.Counter({version: sum(self.running.values())} if self.running else {})

    def arrive(self, version: int) -> None:
        self.present[version] += 1

    def leave(self, version: int) -> None:
        _drop(self.present, version)

    def start(self, version: int) -> None:
        self.running[version] += 1

    def stop(self, version: int) -> None:
        _drop(self.running, version)


def _drop(counts: collections.Counter[int], version: int) -> None:
    """One request of `version` less; a version with none left is no longer counted at all."""
    counts[version] -= 1
    if not counts[version]:
        del counts[version]
