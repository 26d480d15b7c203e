"""SSH round trips to an emulated host on 127.0.0.1 over one persistent connection.

Prints p50/p99 of: connection setup, exec of `true`, exec of a sysfs `cat`, one line through a long-lived
`timesrv` channel (the clock-sync path), and, for contrast, exec over paramiko's own socket (no
TCP_NODELAY: Nagle + delayed ACK). Run: .venv/bin/python benchmarks/bench_ssh_rtt.py [-n 2000]
"""
from __future__ import annotations

import argparse
import logging

import numpy as np
import paramiko

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.emulated.host.server import EmulatedHostServer
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns


def _report(name: str, samples_ns: list[int]) -> float:
    ms = np.asarray(samples_ns) / 1e6
    p50, p99 = np.percentile(ms, [50, 99])
    print(f"{name:<44} n={len(ms):>5}  p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  max {ms.max():7.3f} ms")
    return float(p50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="commands per measurement (default 2000)")
    parser.add_argument("--no-nodelay-n", type=int, default=50, help="commands without TCP_NODELAY (slow)")
    args = parser.parse_args()
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # connection resets at teardown are expected
    with OpticalBench(load_profile("instant"), seed=0) as bench, \
            EmulatedHostServer(bench, bench.hosts[0]) as server:
        resource = server.resource()
        connects = []
        for _ in range(20):
            t0 = now_ns()
            with SshTransport(resource) as ssh:
                ssh.connect()
                connects.append(now_ns() - t0)
        _report("connect (TCP_NODELAY, Ed25519, pubkey)", connects)

        with SshTransport(resource) as ssh:
            for _ in range(50):  # warm-up
                ssh.run("true")
            true_rtt = []
            for _ in range(args.n):
                t = ssh.run("true").timing
                true_rtt.append(t.completed_ns - t.sent_ns)
            exec_p50 = _report("exec 'true' (one connection)", true_rtt)
            cat = []
            for _ in range(args.n):
                t = ssh.run("cat /sys/class/infiniband/mlx5_0/ports/1/state").timing
                cat.append(t.completed_ns - t.sent_ns)
            _report("exec 'cat .../ports/1/state'", cat)
            wall = []
            for _ in range(args.n):
                t0 = now_ns()
                ssh.run("true")
                wall.append(now_ns() - t0)
            wall_p50 = _report("exec 'true' incl. channel open/close", wall)

            ssh.run("mkdir -p ~/.cache/ocs-hil && cat > ~/.cache/ocs-hil/a.py", stdin="#\n", check=True)
            line_rtt = []
            with ssh.stream("python3 -u ~/.cache/ocs-hil/a.py timesrv") as stream:
                for i in range(args.n + 50):
                    t0 = now_ns()
                    stream.write(f"{i}\n")
                    recv_ns, _ = stream.readline(Deadline(10))
                    if i >= 50:
                        line_rtt.append(recv_ns - t0)
            stream_p50 = _report("timesrv line round trip (long-lived channel)", line_rtt)

        client = paramiko.SSHClient()
        client.load_host_keys(str(server.known_hosts_path))
        client.connect("127.0.0.1", port=server.port, username=server.user, key_filename=str(server.client_key_path),
                       look_for_keys=False, allow_agent=False)  # paramiko's own socket: no TCP_NODELAY
        slow = []
        for _ in range(args.no_nodelay_n):
            t0 = now_ns()
            _, stdout, _ = client.exec_command("true")
            stdout.read()
            stdout.channel.recv_exit_status()
            stdout.channel.close()
            slow.append(now_ns() - t0)
        client.close()
        slow_p50 = _report("exec 'true' without TCP_NODELAY (contrast)", slow)
        print(f"ratio exec / timesrv line (p50): {exec_p50 / stream_p50:.1f}x; "
              f"no-NODELAY / NODELAY exec incl. open/close (p50): {slow_p50 / wall_p50:.1f}x")


if __name__ == "__main__":
    main()
