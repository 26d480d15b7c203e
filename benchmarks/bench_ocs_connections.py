"""Emulated TL1 and SCPI servers under many connections: threads and RSS before/after, answers.

    python benchmarks/bench_ocs_connections.py [--clients 200]

Opens N idle connections per protocol (threads and RSS quoted before/after), then N clients that all
query at once (TL1: ACT-USER + RTRV-NETYPE; SCPI: *IDN?), read from one selector: how many were
answered and the time to the last answer, with one client holding half a command and never finishing.
"""
from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.emulated.hostile_peer import connect_crowd, read_all  # noqa: E402
from devices.emulated.ocs_server import OcsServers  # noqa: E402
from devices.emulated.physics import OpticalBench  # noqa: E402
from devices.emulated.profile import load_profile  # noqa: E402

QUERIES = {"tl1": (b"ACT-USER::admin:1::root;RTRV-NETYPE:::2:;", lambda d: b"M  2 COMPLD" in d and d.endswith(b";\r\n")),
           "scpi": (b"*IDN?\n", lambda d: d.endswith(b"\n"))}


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    n = parser.parse_args().clients
    bench = OpticalBench(load_profile("instant")).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        for protocol, address in (("tl1", servers.tl1_address), ("scpi", servers.scpi_address)):
            query, done = QUERIES[protocol]
            threads0, rss0 = threading.active_count(), _rss_mb()
            idle = [socket.create_connection(address, timeout=10) for _ in range(n)]
            time.sleep(0.5)
            threads1, rss1 = threading.active_count(), _rss_mb()
            silent = socket.create_connection(address, timeout=10)
            silent.sendall(query[:5])  # half a command, never finished
            started = time.monotonic()
            clients = connect_crowd(address, n)  # all at once: the listen backlog is exercised too
            for c in clients:
                try:
                    c.sendall(query)
                except OSError:
                    pass  # refused or reset: counted as not answered
            answered = sum(1 for data in read_all(clients, done).values() if done(data))
            took = time.monotonic() - started
            print(f"{protocol}: {n} idle connections: threads {threads0} -> {threads1}, RSS {rss0:.0f} -> "
                  f"{rss1:.0f} MiB; {n} concurrent querying clients (+1 silent): {answered} answered, "
                  f"last answer after {took * 1e3:.0f} ms")
            for s in idle + clients + [silent]:
                s.close()
    finally:
        servers.stop()
        bench.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
