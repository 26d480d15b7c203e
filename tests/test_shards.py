"""Hosts served by worker processes (`EmulatedBench(..., workers=N)`): the same host behaviour over real SSH
while the physics, its schedule and its ground truth stay in the bench's process."""
from __future__ import annotations

import os

import pytest
import test_ssh_host_agent as agent

from devices.emulated.bench import EmulatedBench
from devices.ssh import SshTransport


@pytest.fixture(scope="module")
def pod():
    with EmulatedBench("instant", seed=3, workers=2) as b:
        yield b


@pytest.fixture(scope="module")
def bench(pod):
    return pod.physics


@pytest.fixture(scope="module")
def server(pod):
    return pod.host_servers[pod.physics.hosts[1]]  # dealt to the second worker


@pytest.fixture(scope="module")
def ssh(server):
    with SshTransport(server.resource()) as t:
        t.run(f"mkdir -p ~/.cache/ocs-hil && cat > {agent.AGENT}", stdin="# the agent program\n", check=True)
        yield t


# The agent protocol's own tests, against a host a worker serves: due-time stamps through the push pipe,
# initial values through a call into the physics, host clocks computed in the worker.
test_watch_on_a_worker_host = agent.test_watch_reports_each_change_at_the_next_poll_tick
test_timesrv_on_a_worker_host = agent.test_timesrv_answers_with_the_host_clock


def test_hosts_are_dealt_to_worker_processes_and_the_inventory_names_them(pod):
    shards = pod._shards
    pids = {w.process.pid for w in shards.workers}
    assert len(pids) == 2 and os.getpid() not in pids
    assert [h for w in shards.workers for h in w.hosts] == pod.physics.hosts[0::2] + pod.physics.hosts[1::2]
    inventory = pod.inventory()["hosts"]
    assert {h: inventory[h]["port"] for h in pod.physics.hosts} == {h: s.port for h, s in pod.host_servers.items()}


def test_a_host_command_acts_on_the_one_physics(bench, server, ssh):
    nic = bench.nic_ports(server.host_name)[1]
    ssh.run(f"ip link set dev {nic.netdev} down", check=True)
    assert not bench.nic_snapshot(server.host_name, nic.netdev).admin_up
    ssh.run(f"ip link set dev {nic.netdev} up", check=True)
    assert bench.nic_snapshot(server.host_name, nic.netdev).admin_up


def test_a_clock_step_and_a_dropped_connection_reach_the_worker(pod, bench, server, ssh):
    host = server.host_name
    bench.step_host_clock(host, 7_000_000_000)
    before = bench.host_clock_ns(host)
    reported = int(ssh.run("date +%s%N", check=True).stdout)
    after = bench.host_clock_ns(host)
    assert before <= reported <= after  # the worker's clock is the physics' clock, step included
    assert server.drop_connections() == 1  # the one client connection (this module's), closed by its worker
    assert pod.host_servers[pod.physics.hosts[0]].drop_connections() == 0  # another worker's host: no client
