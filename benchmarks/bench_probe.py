"""RoCEv2 probes through the netns data plane (needs root).

1. Paced send rate achieved by the agent's `probe-send` at 10 k and 50 kpps (busy-waiting the last 50 µs,
   and always), and loss, counted by a raw AF_PACKET receiver with kernel timestamps in the receiving
   namespace.
2. Carrier up-toggle (raw RTM_NEWLINK on the sender's OCS-side veth) → first probe's kernel rx timestamp
   as the agent's `probe-recv` reports it (`first` line), n cycles of 30 ms down / 70 ms up per rate.
3. The plane's own costs: netlink link up/down vs an `ip link set` fork, netlink filter replace vs a
   `tc filter replace` fork (re-point), and physics `phy_up` → OCS-side veth up through NetnsPlane.

Run: sudo .venv/bin/python benchmarks/bench_probe.py [--cycles 40] [--seconds 2] [--nice -10]
"""
from __future__ import annotations

import argparse
import itertools
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np

from devices.agent import AGENT_FILE, build_probe_template
from devices.emulated.netns import NetnsPlane, Rtnetlink, in_netns, netns_available
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import profile_from_dict
from devices.timing import now_ns

PROFILE = {
    "name": "bench-probe",
    "ocs": {"switch": {"dist": "fixed", "ms": 5}, "dark": {"dist": "fixed", "ms": 0.5}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.5}, "cdr_lock": {"dist": "fixed", "ms": 0.5},
            "phy_up": {"dist": "fixed", "ms": 1}, "port_active": {"dist": "fixed", "ms": 0},
            "link_down": {"dist": "fixed", "ms": 0.5}},
    "hosts": {"clock_offset_ms": [0, 0], "drift_ppm": [0, 0]},
    "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [2, 2]},
}
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
PAYLOAD_OFFSET = 14 + 20 + 8 + 12  # Ether, IPv4, UDP, BTH
NICE = 0


def report(name: str, values: np.ndarray, unit: str = "µs", scale: float = 1e3) -> None:
    v = np.asarray(values, dtype=float) / scale
    if len(v) == 0:
        print(f"{name:<52} n=    0")
        return
    p50, p99 = np.percentile(v, [50, 99])
    print(f"{name:<52} n={len(v):>6}  p50 {p50:9.1f} {unit}  p99 {p99:9.1f} {unit}  max {v.max():9.1f} {unit}")


class RawCounter:
    """Every probe arriving on `iface` in namespace `netns`: (kernel rx ns, seq), read on a thread."""

    def __init__(self, netns: str, iface: str):
        with in_netns(netns):
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # hears nothing until bound
        self.sock.bind((iface, 0x0800))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
        self.sock.settimeout(0.2)
        self.rx: list[tuple[int, int]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data, anc, _, addr = self.sock.recvmsg(256, socket.CMSG_SPACE(16))
            except socket.timeout:
                continue
            if addr[2] == 4 or len(data) < 58 or data[23] != 17:
                continue
            ts = next((struct.unpack_from("@qq", v) for lvl, kind, v in anc
                       if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS), None)
            if ts is not None:
                self.rx.append((ts[0] * 1_000_000_000 + ts[1], struct.unpack_from("!Q", data, PAYLOAD_OFFSET)[0]))

    def stop(self) -> list[tuple[int, int]]:
        time.sleep(0.3)  # let the queue drain
        self._stop = True
        self._thread.join()
        self.sock.close()
        return self.rx


def agent(plane: NetnsPlane, host: str, *args: str) -> subprocess.Popen:
    prio = ["nice", "-n", str(NICE)] if NICE else []
    return plane.run_in(host, [*prio, sys.executable, "-u", str(AGENT_FILE), *args], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)


def wait_carrier(plane: NetnsPlane, host: str, netdev: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = subprocess.run(["ip", "-n", plane.netns_of(host), "-o", "link", "show", netdev],
                             capture_output=True, text=True).stdout
        if "LOWER_UP" in out:
            return
        time.sleep(0.01)
    raise RuntimeError(f"{host}:{netdev} never got carrier")


def bench_rates(plane, a, b, template: bytes, seconds: float) -> None:
    print(f"\n-- paced send rate and loss ({seconds:.0f} s per rate)")
    for pps, spin_us in itertools.product((10_000, 50_000), (50, 1_000_000)):
        print(f"spin {'last 50 µs (default)' if spin_us == 50 else 'always (100 % of a core)'}:")
        counter = RawCounter(plane.netns_of(b.host), b.netdev)
        interval_us = 1_000_000 // pps
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--template", template.hex(),
                   "--interval-us", str(interval_us), "--spin-us", str(spin_us))
        time.sleep(seconds)
        tx.stdin.close()
        summary = tx.stdout.read().split()
        tx.wait()
        rx = counter.stop()
        sent, errors = int(summary[1]), int(summary[3])
        times = np.array([t for t, _ in rx])
        seqs = np.array([s for _, s in rx])
        span = (times[-1] - times[0]) / 1e9 if len(times) > 1 else float("nan")
        rate = (len(times) - 1) / span
        missing = int(seqs.max() - seqs.min() + 1 - len(seqs)) if len(seqs) else 0  # skipped ticks + loss
        print(f"target {pps:>6} pps: received {len(rx)} of {sent} sent (loss {sent - len(rx)}, "
              f"{100 * (sent - len(rx)) / max(sent, 1):.3f} %), send errors {errors}, "
              f"rx rate {rate:,.0f} pps ({rate / pps:.4f} of target), missing seqs {missing}")
        report(f"  inter-arrival at {pps} pps", np.diff(times), "µs")


def bench_first_probe(plane, links: Rtnetlink, a, b, template: bytes, cycles: int) -> None:
    print(f"\n-- carrier up-toggle → first probe (kernel rx ts via agent probe-recv), {cycles} cycles per rate")
    pa = plane.port(a.host, a.netdev)
    for pps in (10_000, 50_000):
        rx = agent(plane, b.host, "probe-recv", "--iface", b.netdev, "--gap-us", "5000")
        lines: list[list[str]] = []
        reader = threading.Thread(target=lambda: lines.extend(line.split() for line in rx.stdout), daemon=True)
        reader.start()
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--template", template.hex(),
                   "--interval-us", str(1_000_000 // pps))
        time.sleep(0.3)
        ups = []
        acks = []
        for _ in range(cycles):
            links.set_up(pa.ocs_ifindex, False)
            time.sleep(0.03)
            sent = time.time_ns()
            links.set_up(pa.ocs_ifindex, True)
            acks.append(time.time_ns() - sent)
            ups.append(sent)
            time.sleep(0.07)
        tx.stdin.close()
        summary = tx.stdout.read().split()
        tx.wait()
        time.sleep(0.05)
        rx.stdin.close()
        rx.wait()
        reader.join()
        firsts = np.array(sorted(int(w[0]) for w in lines if len(w) == 4 and w[1] == "first"))
        latency = []
        for up in ups:
            later = firsts[np.searchsorted(firsts, up):]
            if len(later) and later[0] - up < 30_000_000:
                latency.append(later[0] - up)
        print(f"target {pps} pps: sent {summary[1]}, send errors {summary[3]} (ENOBUFS while carrier down), "
              f"matched {len(latency)}/{cycles} up-toggles")
        report(f"  up-toggle → first probe rx ts at {pps} pps", np.array(latency), "µs")
        report("  RTM_NEWLINK up: send → ack", np.array(acks), "µs")


def bench_plane_costs(plane, bench, links: Rtnetlink, a, b, cycles: int) -> None:
    print("\n-- data-plane control costs")
    pa = plane.port(a.host, a.netdev)
    fork = []
    for i in range(cycles):
        t = now_ns()
        subprocess.run(["ip", "-n", plane.ocs_netns, "link", "set", pa.ocs_dev, "down" if i % 2 == 0 else "up"],
                       check=True)
        fork.append(now_ns() - t)
    nl = []
    for i in range(cycles):
        t = now_ns()
        links.set_up(pa.ocs_ifindex, i % 2 == 1)
        nl.append(now_ns() - t)
    report("`ip -n NS link set` (fork + netlink)", np.array(fork), "µs")
    report("raw RTM_NEWLINK send → ack", np.array(nl), "µs")
    repoint_fork, repoint_nl = [], []
    other = plane.port(b.host, b.netdev)
    for i in range(cycles):
        t = now_ns()
        subprocess.run(plane.tc_command(pa, other if i % 2 else pa), check=True)
        repoint_fork.append(now_ns() - t)
    for i in range(cycles):
        t = now_ns()
        links.redirect(pa.ocs_ifindex, (other if i % 2 else pa).ocs_ifindex)
        repoint_nl.append(now_ns() - t)
    report("`tc filter replace` fork (re-point one port)", np.array(repoint_fork), "µs")
    report("raw RTM_NEWTFILTER u32+mirred send → ack", np.array(repoint_nl), "µs")

    bench.ocs_apply({}, removes=list(bench.ocs_patches()))
    bench.wait_idle()
    plane.settle()
    follow = []
    for _ in range(cycles):
        start = len(plane.op_log)
        t0 = now_ns()
        bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
        bench.wait_idle()
        plane.settle()
        phy_up = next(t["t_ns"] for t in bench.ground_truth()
                      if t["stage"] == "phy_up" and t["host"] == b.host and t["t_ns"] >= t0)
        done = next(d for kind, key, _, d in plane.op_log[start:] if kind == "carrier" and key == b.key)
        follow.append(done - phy_up)
        bench.ocs_apply({}, removes=[a.ocs_tx, b.ocs_tx])
        bench.wait_idle()
        plane.settle()
    report("physics phy_up → OCS-side veth up (netlink ack)", np.array(follow), "µs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--nice", type=int, default=0, help="run the agents under `nice -n N` (e.g. -10 on a "
                        "shared, loaded machine)")
    args = parser.parse_args()
    global NICE
    NICE = args.nice
    reason = netns_available()
    if reason:
        print(f"skipped: network namespaces unavailable ({reason})")
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; agents at nice {NICE}")
    with OpticalBench(profile_from_dict(PROFILE), seed=1) as bench, \
            NetnsPlane(bench, f"hilb{os.getpid() % 100000}") as plane:
        a, b = bench.all_nic_ports()
        bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
        bench.wait_idle()
        plane.settle()
        wait_carrier(plane, a.host, a.netdev)
        wait_carrier(plane, b.host, b.netdev)
        template = build_probe_template(a.mac, b.mac, plane.port(a.host, a.netdev).ip,
                                        plane.port(b.host, b.netdev).ip)
        links = Rtnetlink(plane.ocs_netns)
        try:
            bench_rates(plane, a, b, template, args.seconds)
            bench_first_probe(plane, links, a, b, template, args.cycles)
            bench_plane_costs(plane, bench, links, a, b, args.cycles)
        finally:
            links.close()
        if plane.errors:
            print("plane errors:", plane.errors)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
