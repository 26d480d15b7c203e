"""Preflight's quick_check and the end-of-run device identity over N emulated hosts, their connections open.

    .venv/bin/python benchmarks/bench_probe_fanout.py [--hosts 64] [--reply-delay-ms 10]

`--reply-delay-ms` makes every output write of a host's commands wait that long (the emulator's `slow_host`
fault on every host: a remote host's latency, which the 2-core emulator otherwise lacks: its probes are CPU,
not wait). Prints both wall times; run it on two commits to compare one-after-another with all-at-once.
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import yaml

from devices.emulated.bench import EmulatedBench
from devices.emulated.profile import load_profile
from devices.ssh import SshTransport
from harness import preflight
from harness.config import load_inventory
from harness.identity import device_identity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--reply-delay-ms", type=float, default=10.0)
    args = parser.parse_args()
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # connection resets as the emulator stops
    out = Path(tempfile.mkdtemp(prefix="fanout-"))
    data = yaml.safe_load(Path(load_profile("instant").path).read_text())
    data["name"] = f"fanout-{args.hosts}"
    data["topology"] = {"hosts": args.hosts, "nics_per_host": 1, "ocs_size": [args.hosts, args.hosts]}
    (out / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with EmulatedBench(str(out / "profile.yaml"), seed=1) as emulated:
        bench = load_inventory(emulated.inventory_path)
        for server in emulated.host_servers.values():
            server.reply_delay_s = args.reply_delay_ms / 1e3
        transports = {h: SshTransport(r) for h, r in bench.hosts.items()}
        try:
            for transport in transports.values():
                transport.run("true")
            t0 = time.perf_counter()
            problems = preflight.quick_check(bench, switch_of=lambda name: emulated_switch,
                                             transport_of=transports.__getitem__)
            t1 = time.perf_counter()
            sessions = {h: type("Session", (), {"transport": t})() for h, t in transports.items()}
            found = device_identity({}, sessions, bench.nic_ports)
            t2 = time.perf_counter()
        finally:
            for transport in transports.values():
                transport.close()
    answered = sum(v.get("error") is None for v in found["hosts"].values())
    print(f"{args.hosts} hosts, reply delay {args.reply_delay_ms:g} ms: quick_check {t1 - t0:.2f} s "
          f"({len(problems)} problems), device identity {t2 - t1:.2f} s ({answered}/{args.hosts} answered)")


class _Answers:
    """The switch side is not what is measured here: a switch that answers at once."""

    @staticmethod
    def patches() -> dict:
        return {}


emulated_switch = _Answers()

if __name__ == "__main__":
    main()
