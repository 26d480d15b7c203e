"""OCS command round trips against the emulator (profile `instant`, so only protocol + stack cost shows).

    .venv/bin/python benchmarks/bench_tl1_rtt.py [--count 2000]

Prints p50/p99 of: TL1 RTRV-PATCH through the driver vs a bare socket client (driver overhead ratio),
a TL1 connect+disconnect cycle, SCPI `:CONN:STAT?` over TCP and the pty, and NETCONF `get-config` of
`cross-connects` (wire time, as stamped by the driver, and the whole ncclient call).
"""
from __future__ import annotations

import argparse
import socket

import numpy as np

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.ocs import get_protocol, open_switch
from devices.resources import OcsResource
from devices.timing import now_ns


def stats(samples_ns: list[int]) -> tuple[float, float]:
    values = np.asarray(samples_ns, dtype=float) / 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def report(name: str, samples_ns: list[int]) -> float:
    p50, p99 = stats(samples_ns)
    print(f"{name:<44} n={len(samples_ns):5d}  p50 {p50:8.1f} µs  p99 {p99:8.1f} µs")
    return p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    count, warmup = args.count, 100
    bench = OpticalBench(load_profile("instant")).start()
    servers = OcsServers(bench).start()
    n, m = bench.ocs_size
    allowed = frozenset(range(1, n + m + 1))
    host, port = servers.tl1_address
    tl1 = open_switch(OcsResource("ocs1", "polatis-tl1", f"tcp://{host}:{port}", (n, m), allowed,
                                  user="admin", password="root"))
    try:
        tl1.apply({i: n + i for i in range(1, n + 1)})  # a full switch: 16 payload lines per reply
        samples = []
        for k in range(count + warmup):
            tl1.patches()
            if k >= warmup:
                samples.append(tl1.last_timing.completed_ns - tl1.last_timing.sent_ns)
        driver_p50 = report("TL1 RTRV-PATCH, driver (16 patches)", samples)

        with socket.create_connection((host, port)) as sock:  # the floor: no parsing at all
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(b"ACT-USER::admin:1::root;")
            sock.recv(4096)
            samples = []
            for k in range(count + warmup):
                t0 = now_ns()
                sock.sendall(f"RTRV-PATCH:::{k % 999999 + 2}:;".encode())
                data = b""
                while not data.endswith(b"\r\n;\r\n"):
                    data += sock.recv(65536)
                if k >= warmup:
                    samples.append(now_ns() - t0)
        raw_p50 = report("TL1 RTRV-PATCH, bare socket", samples)
        print(f"{'driver / bare socket p50 ratio':<44} {driver_p50 / raw_p50:.2f}")

        tl1.command("DLT-PATCH", "ALL")
        samples = []
        for k in range(count // 2 + warmup):
            t0 = now_ns()
            tl1.connect(1, n + 1)
            tl1.disconnect([1])
            if k >= warmup:
                samples.append(now_ns() - t0)
        report("TL1 ENT-PATCH + DLT-PATCH (incl. 1 read)", samples)

        for label, url in (("tcp", "tcp://%s:%d" % servers.scpi_address), ("pty", servers.pty_path)):
            scpi = open_switch(OcsResource("ocs1", "polatis-scpi", url, (n, m), allowed))
            samples = []
            for k in range(count + warmup):
                scpi.patches()
                if k >= warmup:
                    samples.append(scpi.last_timing.completed_ns - scpi.last_timing.sent_ns)
            scpi.close()
            report(f"SCPI :CONN:STAT? over {label}", samples)

        view = get_protocol("polatis-netconf").start_emulator(servers)
        netconf = open_switch(OcsResource("ocs1", "polatis-netconf", view.url, (n, m), allowed,
                                          user="admin", password="root"))
        try:
            wire, call = [], []
            for k in range(count + warmup):
                t0 = now_ns()
                netconf.patches()
                if k >= warmup:
                    call.append(now_ns() - t0)
                    wire.append(netconf.last_timing.completed_ns - netconf.last_timing.sent_ns)
            report("NETCONF get-config cross-connects, wire", wire)
            report("NETCONF get-config, whole ncclient call", call)
        finally:
            netconf.close()
            view.stop()
    finally:
        tl1.close()
        servers.stop()
        bench.stop()


if __name__ == "__main__":
    main()
