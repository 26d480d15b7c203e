"""`harness emulate` as a user meets it: a stock OpenSSH client and a raw TCP TL1 client against it."""
from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml


@pytest.fixture
def emulate(tmp_path):
    inventory = tmp_path / "bench.yaml"
    truth = tmp_path / "truth.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--profile", "instant",
                             "--inventory-out", str(inventory), "--truth-out", str(truth),
                             "--wire-out", str(tmp_path / "wire.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while not inventory.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert inventory.exists(), proc.stderr.read() if proc.poll() is not None else "no inventory"
    yield yaml.safe_load(inventory.read_text()), truth, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def tl1(sock: socket.socket, command: str) -> str:
    sock.sendall(command.encode() + b"\r\n")
    data = b""
    while not data.rstrip().endswith(b";"):
        chunk = sock.recv(4096)
        assert chunk, "TL1 server closed the connection"
        data += chunk
    return data.decode()


def test_raw_tl1_client_and_stock_ssh(emulate):
    inventory, truth, proc = emulate
    ocs = inventory["ocs"]["ocs1"]
    host, port = ocs["url"].removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert "DENY" in tl1(s, "RTRV-PATCH:::1:;")  # not logged in yet
        assert "COMPLD" in tl1(s, "ACT-USER::admin:2::root;")
        assert "COMPLD" in tl1(s, "ENT-PATCH::1,17:3:;")
        reply = tl1(s, "RTRV-PATCH:::4:;")
        assert "M  4 COMPLD" in reply and '"1,17"' in reply
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client on this machine (.ci/run installs openssh-client)")
    h = inventory["hosts"]["gpu1"]
    out = subprocess.run(["ssh", "-i", h["identity_file"], "-o", f"UserKnownHostsFile={h['known_hosts']}",
                          "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(h["port"]),
                          f"{h['user']}@127.0.0.1", "cat /sys/class/infiniband/mlx5_0/ports/1/state"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout in ("1: DOWN\n", "4: ACTIVE\n")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    # at exit, how late this machine let its schedule run: the ENT-PATCH's mirror and the light it brought
    (schedule,) = [line for line in proc.stdout.read().splitlines() if line.startswith("emulator schedule: ")]
    actions = re.search(r"its thread ran (\d+) actions p50 [0-9.]+ ms, p99 [0-9.]+ ms, max [0-9.]+ ms after due",
                        schedule)
    assert actions and int(actions[1]) >= 2, schedule
    assert truth.exists()  # the ground truth of what the switch did is written on exit
    assert any('"mirror_settled"' in line for line in truth.read_text().splitlines())
    # the SSH server's sends on that connection: when each began, where its bytes end in the stream
    (connection,) = [c for c in json.loads((truth.parent / "wire.json").read_text()) if c["local"] == h["port"]]
    began, ends = zip(*connection["sent"])
    assert list(began) == sorted(began) and all(a < b for a, b in zip(ends, ends[1:])) and len(ends) > 5


def test_wire_out_with_host_workers_is_refused_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "emulate", "--profile", "instant", "--workers", "2",
                          "--inventory-out", str(tmp_path / "x.yaml"), "--wire-out", str(tmp_path / "w.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--wire-out" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_bad_profile_is_one_line_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "emulate", "--profile", "nope",
                          "--inventory-out", str(tmp_path / "x.yaml")], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown profile" in out.stderr and "Traceback" not in out.stderr
