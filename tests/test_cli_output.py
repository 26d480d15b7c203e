"""The CLI as a script meets it: `--json` alone on stdout (parsed through a real pipe), progress and summaries
on stderr as plain unwrapped lines, and a run directory that keeps its console.log and wire.log with no
secret in any file."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECRET = f"Zq-{os.getpid()}-wire-secret"
# `harness run` exactly, with the emulated switch's login password set to SECRET (the emulator's is fixed)
RUN = ("import sys, devices.emulated.bench as b; b.EMULATED_PASSWORD = sys.argv[1]; "
       "from harness.cli import main; sys.exit(main(sys.argv[2:]))")


def test_a_run_piped_into_a_json_reader(tmp_path):
    """`harness run playbooks/turnaround.yaml --bench emulated:instant --cycles 3 --json | python -c json.load`:
    one run (a fixture would run once per test worker), each part of its output checked below."""
    piped_run = _piped_run(tmp_path)
    json_alone_on_stdout(piped_run)
    progress_and_summary_on_stderr_plain_and_unwrapped(piped_run)
    console_log_keeps_what_the_console_showed(piped_run)
    wire_log_has_switch_bytes_both_ways_and_ssh_commands(piped_run)
    no_file_of_the_run_holds_the_secret(piped_run)


def _piped_run(tmp: Path):
    run_dir, err = tmp / "run", tmp / "stderr"
    env = dict(os.environ, OCS_HIL_EMULATED_PASSWORD=SECRET, COLUMNS="80")
    env.pop("FORCE_COLOR", None)
    harness = " ".join(map(str, [sys.executable, "-c", repr(RUN), SECRET, "run", "playbooks/turnaround.yaml",
                                 "--bench", "emulated:instant", "--cycles", "3", "--json", "--out", run_dir]))
    reader = f"{sys.executable} -c 'import json,sys; print(json.load(sys.stdin)[\"status\"])'"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", f"{harness} 2>{err} | {reader}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, err.read_text(), run_dir


def json_alone_on_stdout(piped_run):
    proc, stderr, _ = piped_run
    assert proc.returncode == 0, proc.stderr + stderr
    assert proc.stdout == "ok\n"


def progress_and_summary_on_stderr_plain_and_unwrapped(piped_run):
    _, stderr, run_dir = piped_run
    lines = stderr.splitlines()
    assert any(re.match(r"turnaround\s.*3/3", line) for line in lines), stderr  # the progress bar's last state
    assert "done: ok" in stderr
    # a line longer than 80 columns stays one line (the p99 column's note, said once under the table), and no
    # box is drawn around the table
    assert any(line.lstrip().startswith("OCS command → completed") for line in lines), stderr
    (note,) = [line for line in lines if "p99 needs" in line]
    assert len(note.rstrip()) > 80 and note.endswith("the cycles support."), stderr
    assert not set("┏┓┃│└┘┡╇") & set(stderr)  # a box's corners and sides (the bar's ━ aside)


def console_log_keeps_what_the_console_showed(piped_run):
    _, stderr, run_dir = piped_run
    console = (run_dir / "console.log").read_text()
    assert "done: ok" in console and "OCS command → completed" in console
    assert "\x1b[" not in console


def wire_log_has_switch_bytes_both_ways_and_ssh_commands(piped_run):
    _, _, run_dir = piped_run
    wire = (run_dir / "wire.log").read_text().splitlines()
    records = [line.split(" ", 3) for line in wire if not line.startswith("#")]
    assert all(r[0].isdigit() for r in records)
    tl1 = [(arrow, text) for _, peer, arrow, text in records if peer.startswith("tcp://")]
    # the switch's reply to one ENT-PATCH, by its ctag: the command out, its COMPLD back
    sent = [text for arrow, text in tl1 if arrow == ">" and text.startswith("ENT-PATCH:")]
    assert sent and sent[0].endswith(";\\r\\n"), tl1[:8]
    ctag = sent[0].split(":")[3]
    assert ("<", f"M  {ctag} COMPLD\\r\\n") in tl1
    assert (">", "ACT-USER::admin:1::***;\\r\\n") in tl1  # the login, its password hidden
    ssh = [(peer, arrow, text) for _, peer, arrow, text in records if arrow in "$="]
    assert ("gpu1", "$", "ip -j link") in ssh
    assert any(p == "gpu1" and a == "=" and re.match(r"exit 0 in [0-9.]+ ms, .*: ip -j link$", t) for p, a, t in ssh)


def no_file_of_the_run_holds_the_secret(piped_run):
    proc, stderr, run_dir = piped_run
    assert proc.returncode == 0  # logged in: the secret went over the wire
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10 and {"wire.log", "console.log", "manifest.json"} <= {p.name for p in files}
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    assert SECRET not in stderr


def test_a_secret_echoed_back_is_hidden_too(tmp_path):
    """The driver hides the password it sends; a peer that echoes it (or puts it in any line) is caught by the
    log's own scrub of every secret the bench holds."""
    from devices import wirelog
    from devices.resources import Bench, OcsResource
    from harness import logs

    bench = Bench(name="b", emulated=False, ocs={"o": OcsResource(name="o", protocol="polatis-tl1", url="tcp://x:1",
                                                                  size=(1, 1), allowed_ports=frozenset(),
                                                                  password=SECRET)},
                  hosts={}, nic_ports=())
    with logs.run_logs(tmp_path):
        logs.hide_secrets(bench)
        wirelog.record(1, "tcp://x:1", "<", f"ACT-USER::admin:1::{SECRET};\r\n".encode())
        logs.echo(f"peer said {SECRET}", quiet=True)
    assert "ACT-USER::admin:1::***;\\r\\n" in (tmp_path / "wire.log").read_text()
    assert "peer said ***" in (tmp_path / "console.log").read_text()


@pytest.fixture(scope="module")
def switch_servers():
    from devices.emulated.netconf_server import NetconfServer
    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile

    bench = OpticalBench(load_profile("instant"), seed=3).start()
    servers = OcsServers(bench, pty=False).start()
    with NetconfServer(servers) as netconf:
        yield servers, netconf
    servers.stop()
    bench.stop()


def test_debug_shows_scpi_and_netconf_bytes_both_ways(switch_servers, capsys, monkeypatch):
    from harness.cli import main

    servers, netconf = switch_servers
    monkeypatch.setenv("OCS_HIL_TEST_PASSWORD", "root")
    host, port = servers.scpi_address
    scpi = f"tcp://{host}:{port}"
    assert main(["--debug", "ocs", "--url", scpi, "--protocol", "polatis-scpi", "connect", "2", "18"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(re.fullmatch(rf"\d+ {scpi} > [^ ].*\\r\\n", line) for line in err), err
    assert any(re.fullmatch(rf"\d+ {scpi} < .+", line) for line in err), err
    assert main(["ocs", "--url", netconf.url, "--protocol", "polatis-netconf", "--user", "admin",
                 "--password-env", "OCS_HIL_TEST_PASSWORD", "list", "--debug"]) == 0
    out, err = capsys.readouterr()
    assert out == "2 -> 18\n"
    peer = re.escape("netconf://" + netconf.url.removeprefix("ssh://").split("?")[0])
    assert any(re.fullmatch(rf"\d+ {peer} > .*<nc:rpc .*get-config.*", line) for line in err.splitlines()), err
    assert any(re.fullmatch(rf"\d+ {peer} < .*<rpc-reply .*", line) for line in err.splitlines()), err


@pytest.mark.parametrize("chosen, expected", [(None, "system"), ("jemalloc", "jemalloc")])
def test_the_cli_gives_arrow_the_c_allocator_unless_the_user_chose_one(chosen, expected):
    """Arrow's default pool (mimalloc) keeps memory a campaign's end freed: the CLI asks for the C library's,
    which returns it; an ARROW_DEFAULT_MEMORY_POOL of the user's stands."""
    import pyarrow as pa

    if expected not in pa.supported_memory_backends():
        pytest.skip(f"this pyarrow has no {expected} pool")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    code = ("import contextlib, sys; from harness.cli import main\n"
            "with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit): main(['--version'])\n"
            "import pyarrow as pa; print(pa.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
