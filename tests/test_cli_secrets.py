"""One password convention across the commands: an inventory's `password_env` names the variable, `harness
ocs --password-env` reads the same, `harness emulate` prints the export line, and `harness validate` lints an
inventory without its secrets unless told it will connect. Also -v/--debug and `sweep --json`."""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
UNSET = f"OCS_HIL_TEST_UNSET_{os.getpid()}"
LAB = f"""bench: {{name: lab-a, emulated: false}}
ocs:
  ocs1:
    protocol: polatis-tl1
    url: tcp://192.0.2.10:3082
    size: [16, 16]
    allowed_ports: ["1-16", "17-32"]
    user: admin
    password_env: {UNSET}
hosts:
  gpu1:
    address: 192.0.2.21
    nics:
      - {{netdev: ens1f0np0, rdma_dev: mlx5_0, rdma_port: 1, ocs: ocs1, tx: 1, rx: 17}}
"""


def test_validate_lints_without_secrets_and_with_connect_names_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(UNSET, raising=False)
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(LAB)
    assert main(["validate", str(inventory)]) == 0
    assert capsys.readouterr().out.startswith(f"{inventory}: ok (inventory 'lab-a'")
    assert main(["validate", "--connect", str(inventory)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"harness: {inventory}:9: ocs.ocs1.password_env: environment variable {UNSET} " \
                                "is not set\n"
    monkeypatch.setenv(UNSET, "x")
    assert main(["validate", "--connect", str(inventory)]) == 0


def test_emulate_prints_the_export_and_harness_ocs_reads_that_variable(tmp_path):
    """As a user would: start `harness emulate`, paste its export line and its `harness ocs` line into a shell."""
    inventory = tmp_path / "bench.yaml"
    env = {k: v for k, v in os.environ.items() if k != "OCS_HIL_EMULATED_PASSWORD"}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--profile", "instant", "--inventory-out",
                             str(inventory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = []
        end = time.monotonic() + 60
        while not any(line.startswith("  gpu1:") for line in banner) and time.monotonic() < end:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            banner.append(line)
        (export,) = [line.strip() for line in banner if line.startswith("export ")]
        name = yaml.safe_load(inventory.read_text())["ocs"]["ocs1"]["password_env"]
        assert export.startswith(f"export {name}=")
        (ocs_line,) = [line.split(": ", 1)[1].strip() for line in banner if "harness ocs " in line]
        assert f"--password-env {name}" in ocs_line
        harness = f"{shlex.quote(sys.executable)} -m harness"
        lint = subprocess.run(["bash", "-c", f"{harness} validate --connect {inventory}"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert lint.returncode == 2 and f"password_env: environment variable {name} is not set" in lint.stderr
        script = (f"{export}\n{ocs_line.replace('harness ', harness + ' ', 1)}\n"
                  f"{harness} validate --connect {inventory}\n")
        used = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert used.returncode == 0, used.stderr
        assert used.stdout.splitlines() == ["no patches", f"{inventory}: ok (inventory 'emulated-instant': 1 OCS, "
                                                          "4 hosts, 8 NIC ports, emulated)"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_harness_ocs_names_the_unset_password_variable_when_the_login_fails(capsys, monkeypatch):
    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile

    monkeypatch.delenv(UNSET, raising=False)
    bench = OpticalBench(load_profile("instant"), seed=2).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        host, port = servers.tl1_address
        code = main(["ocs", "--url", f"tcp://{host}:{port}", "--user", "admin", "--password-env", UNSET, "list"])
    finally:
        servers.stop()
        bench.stop()
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 1 and err[0].endswith(f" (no password: {UNSET} is not set)"), err


@pytest.mark.parametrize("flag, paramiko, wire", [("", False, False), ("-v", True, False), ("--debug", True, True)])
def test_verbose_and_debug_reach_stderr_before_or_after_the_command(flag, paramiko, wire, capsys):
    """paramiko is silent by default (it logs every reset socket), INFO with -v; --debug shows wire records."""
    from devices import wirelog
    from harness import logs
    from harness.cli import build_parser

    flags = [flag] if flag else []
    before = build_parser().parse_args([*flags, "validate", "x.yaml"]).verbosity
    assert before == build_parser().parse_args(["validate", "x.yaml", *flags]).verbosity == \
        build_parser().parse_args(["ocs", "--url", "tcp://h:1", "list", *flags]).verbosity == \
        {"": 0, "-v": 1, "--debug": 2}[flag]
    level = logging.getLogger("paramiko").level
    with logs.verbosity(before):
        logging.getLogger("paramiko.transport").info("Connected (version 2.0, client OpenSSH_9.2p1)")
        wirelog.record(7, "tcp://192.0.2.10:3082", ">", b"RTRV-PATCH:::1:;\r\n")
    err = capsys.readouterr().err
    assert ("INFO paramiko.transport: Connected (version 2.0" in err) == paramiko, err
    assert ("7 tcp://192.0.2.10:3082 > RTRV-PATCH:::1:;\\r\\n" in err) == wire, err
    assert logging.getLogger("paramiko").level == level  # logging left as found


def test_sweep_json_alone_on_stdout(tmp_path, capsys):
    playbook = tmp_path / "sweep.yaml"
    playbook.write_text("name: tiny-sweep\nbench: emulated:instant\nseed: 1\ncycles: 2\nsteps:\n"
                        "  - {type: turnaround, name: measure, pattern: ring-shift, clock_warmup_s: 0.2}\n"
                        "sweep:\n  grid:\n    measure.pattern: [ring-shift]\n  seeds: [1]\n")
    assert main(["sweep", str(playbook), "--out", str(tmp_path / "s"), "--serial", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["points"] == result["rows"] == 1 and result["exit_code"] == 0 and result["failed"] == []
    assert Path(result["results"]).exists()
    assert f"sweep {tmp_path / 's'}: 1 points" in err
