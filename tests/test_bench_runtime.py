"""The bench runtime's rules in milliseconds: fakes for the switch and the hosts, no emulator."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

from devices.ocs.fake import FakeSwitch
from devices.resources import NicPort, OcsResource
from harness.steps.turnaround import SCHEMA, TurnaroundRun


class _RecordingSession:
    def __init__(self):
        self.watched = []

    def start_watch(self, specs, *args):
        self.watched += specs

    def start_clock_sync(self, period_s):
        pass


def test_the_watch_reads_the_inventory_rdma_port(tmp_path):
    ocs = OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                      allowed_ports=frozenset(range(1, 17)))
    nics = (NicPort("h1", "eth0", "mlx5_0", 2, "ocs1", 1, 9), NicPort("h1", "eth1", "mlx5_0", 1, "ocs1", 2, 10))
    session = _RecordingSession()
    ctx = SimpleNamespace(bench=SimpleNamespace(nic_ports=nics), cycles=1, run_dir=tmp_path, resume_after={},
                          dry_run=False, teardown=contextlib.ExitStack(), switch=lambda name: FakeSwitch(ocs),
                          session=lambda host: session)
    step = SimpleNamespace(name="measure", file="pb.yaml", line=1,
                           params={k: d for k, (_, d) in SCHEMA.items()} | {"probes": False})
    TurnaroundRun(ctx, step).setup()
    assert session.watched == [("eth0", "mlx5_0", 2), ("eth1", "mlx5_0", 1)]
