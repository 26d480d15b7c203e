"""A step's run without a bench, for testing one step's logic in milliseconds: `fake_run(inventory, run_dir)`
gives the context a step is called with, its `live` a `FakeLiveBench` — the LiveBench facets over fake switches
(devices.ocs.fake, the same CircuitGuard with its lease check and restore) and given host sessions, with an
optional stand-in for the emulator's `truth` (None: a real bench)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from harness.bench.live import LiveBench


class FakeLiveBench(LiveBench):
    """LiveBench over `ctx` (fake_run's): switches are FakeSwitch over the inventory's OCS resources, sessions
    the ones given (host -> session), `truth` what the test gives (an object with `profile` and `flap`)."""

    def __init__(self, ctx, truth: Any = None):
        super().__init__(ctx)
        self.truth = truth


def fake_run(inventory, run_dir, *, truth: Any = None, sessions: dict | None = None, seed: int = 0,
             lease: Any = None, playbook_bench: str = "fake", **fields) -> SimpleNamespace:
    """The run context a step function is called with (`impl(ctx, step)`), no run behind it: `results`,
    `manifest_extra`, `teardown` (the guards' restores: close it to restore) and `said` (what the step said)
    to read back; `fields` override any attribute."""
    from devices.ocs.fake import FakeSwitch

    switches: dict[str, FakeSwitch] = {}
    sessions = dict(sessions or {})

    def switch(name: str) -> FakeSwitch:
        return switches.setdefault(name, FakeSwitch(inventory.ocs[name]))

    def open_sessions(hosts) -> dict:
        missing = [h for h in hosts if h not in sessions]
        if missing:
            raise KeyError(f"fake_run: no session given for host(s) {', '.join(missing)}")
        return {h: sessions[h] for h in hosts}

    ctx = SimpleNamespace(inventory=inventory, run_dir=Path(run_dir), run_id=Path(run_dir).name, seed=seed, cycles=1,
                          dry_run=False, quiet=True, results={}, resume_after={}, manifest_extra={}, broken=None,
                          lease=lease, guards={}, observations=None, teardown=contextlib.ExitStack(),
                          stack=contextlib.ExitStack(), playbook=SimpleNamespace(bench=playbook_bench, source=None),
                          switch=switch, open_sessions=open_sessions, session=lambda host: open_sessions([host])[host],
                          said=[], switches=switches)
    ctx.say = ctx.said.append
    ctx.latch_broken = lambda why: setattr(ctx, "broken", ctx.broken or why)
    ctx.rng = lambda stream: np.random.default_rng([seed] + [ord(c) for c in stream])
    for key, value in fields.items():
        setattr(ctx, key, value)
    ctx.bench = FakeLiveBench(ctx, truth)
    return ctx
