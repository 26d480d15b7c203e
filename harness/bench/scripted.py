"""`ScriptedObservations`: an in-package fake of the hosts for unit tests of the cycle rules (no SSH, no
emulator, no waiting) — what a scripted agent would have printed, with a known host clock."""
from __future__ import annotations

from harness.bench.hosts import Observation


class ScriptedObservations:
    """Observations on hosts whose clocks run `offset_ns` ahead of the harness, known within `clock_unc_ns`.

    `watch(host, netdev, field, value, at_ns, interval_ns)`: a polled change reported at harness time
    `at_ns` (the poll), having happened within the `interval_ns` before; `probe(...)`: a first probe."""

    def __init__(self, offset_ns: int = 5_000_000, clock_unc_ns: int = 20_000):
        self.offset_ns, self.clock_unc_ns = offset_ns, clock_unc_ns
        self.items: list[Observation] = []

    def convert(self, host: str, host_ns: int) -> tuple[int, int, int]:
        return host_ns - self.offset_ns, self.offset_ns, self.clock_unc_ns

    def watch(self, host: str, netdev: str, field: str, value: str, at_ns: int, interval_ns: int = 200_000):
        obs = Observation("watch", host, netdev, field, str(value), at_ns + self.offset_ns, interval_ns, at_ns)
        self.items.append(obs)
        return obs

    def probe(self, host: str, netdev: str, mac: str, at_ns: int, seq: int = 1):
        obs = Observation("probe", host, netdev, "first", f"{mac} {seq}", at_ns + self.offset_ns, 0, at_ns)
        self.items.append(obs)
        return obs

    def fault(self, host: str, what: str = "agent watch", why: str = "connection lost", at_ns: int = 0):
        obs = Observation("fault", host, "", what, why, 0, 0, at_ns)
        self.items.append(obs)
        return obs
