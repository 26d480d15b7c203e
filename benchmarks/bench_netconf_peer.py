"""The NETCONF driver's round trips against yuma123 netconfd (Polatis' YANG, behind OpenSSH sshd) and against
our emulated server: login, get-config, one edit-config, connect (read + edit), apply (read + edit + read back)
and, on netconfd's default `:candidate`-only set-up, apply through edit + commit.

    OCS_HIL_SHARED=../shared python benchmarks/bench_netconf_peer.py [--rounds 20]

Each figure is the median (and max) wall time over the rounds of the driver's public call, measured around it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.ocs import open_switch  # noqa: E402
from devices.resources import OcsResource  # noqa: E402
from tests.peers.netconfd import NetconfdPeer, missing  # noqa: E402

N = 16


def _resource(url: str, user: str, password: str | None = None) -> OcsResource:
    return OcsResource(name="ocs1", protocol="polatis-netconf", url=url, size=(N, N),
                       allowed_ports=frozenset(range(1, 2 * N + 1)), user=user, password=password)


def measure(resource: OcsResource, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}

    def timed(name, call):
        start = time.perf_counter()
        result = call()
        times.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
        return result

    switch = timed("login (ssh + hello)", lambda: open_switch(resource, timeout_s=10))
    try:
        switch.apply({}, exclusive=True)
        for r in range(rounds):
            timed("get-config (patches)", switch.patches)
            timed("connect (read + edit)", lambda: switch.connect(1, 25 + r % 2))
            timed("disconnect (read + edit)", lambda: switch.disconnect([1]))
            change = timed("apply (read + edit + read)", lambda: switch.apply({2: 18 + r % 2, 3: 20 + r % 2}))
            times.setdefault("apply's change (edit or commit: write to reply)", []).append(change.elapsed_s * 1e3)
        for _ in range(rounds - 1):
            timed("login (ssh + hello)", lambda: open_switch(resource, timeout_s=10).close())
    finally:
        switch.apply({}, exclusive=True)
        switch.close()
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    for name, values in times.items():
        print(f"  {name:<50} median {statistics.median(values):7.1f} ms  max {max(values):7.1f} ms  (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    why_not = missing()
    if why_not:
        print(f"netconfd peer unavailable: {why_not}", file=sys.stderr)
        return 2
    for target in ("running", None):
        with NetconfdPeer(target=target) as peer:
            report(f"netconfd --target={target or '(default: candidate)'}",
                   measure(_resource(peer.url, peer.user), args.rounds))
    from devices.emulated.netconf_server import NetconfServer
    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile

    bench = OpticalBench(load_profile("instant"), seed=1).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        for target in ("running", "candidate"):
            with NetconfServer(servers, target=target) as server:
                report(f"emulated NETCONF server, target {target}",
                       measure(_resource(server.url, "admin", "root"), args.rounds))
    finally:
        servers.stop()
        bench.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
