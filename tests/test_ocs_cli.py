"""`harness ocs` end to end against the emulator: results, exit codes, one-line errors."""
from __future__ import annotations

import json

import pytest

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from harness.cli import main


@pytest.fixture(scope="module")
def servers():
    bench = OpticalBench(load_profile("instant"), seed=4).start()
    servers = OcsServers(bench).start()
    yield servers
    servers.stop()
    bench.stop()


def _tl1(servers) -> list[str]:
    host, port = servers.tl1_address
    return ["ocs", "--url", f"tcp://{host}:{port}", "--protocol", "polatis-tl1", "--user", "admin",
            "--password", "root"]


def test_connect_list_power_identify_disconnect(servers, capsys):
    base = _tl1(servers)
    assert main(base + ["connect", "1", "17"]) == 0
    assert capsys.readouterr().out.startswith("connected 1 -> 17 in ")
    assert main(base + ["--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out) == {"1": 17}
    assert main(base + ["power", "1", "18"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "18 -60.00 dBm"
    assert main(base + ["identify"]) == 0
    assert "POLATIS" in capsys.readouterr().out
    assert main(base + ["--json", "disconnect", "1"]) == 0
    timing = json.loads(capsys.readouterr().out)
    assert timing["sent_ns"] <= timing["completed_ns"]


def test_scpi_over_the_pty_and_apply(servers, capsys):
    base = ["ocs", "--url", servers.pty_path, "--protocol", "polatis-scpi"]
    assert main(base + ["apply", "2:18", "3:19"]) == 0
    assert main(base + ["list"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["2 -> 18", "3 -> 19"]
    assert main(base + ["--allowed-ports", "1-16,17-32", "apply", "--exclusive", "4:20"]) == 0
    assert main(base + ["--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"4": 20}


def test_device_refusals_exit_1_with_one_line(servers, capsys):
    base = _tl1(servers)
    main(base + ["connect", "5", "21"])
    capsys.readouterr()
    assert main(base + ["connect", "6", "21"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SROF" in err[0]
    assert main(base[:-4] + ["list"]) == 1  # no login
    assert "PLNA" in capsys.readouterr().err
    assert main(base + ["--allowed-ports", "1-4", "connect", "5", "22"]) == 1
    assert "not in the allowed ports" in capsys.readouterr().err


@pytest.mark.parametrize("argv, fragment", [
    (["--url", "ftp://127.0.0.1", "list"], "unknown scheme"),
    (["--url", "tcp://127.0.0.1:99999", "list"], "out of range"),
    (["--url", "tcp://127.0.0.1:x", "list"], "not a number"),
    (["--url", "/dev/ttyUSB0", "list"], "expected tcp://"),  # TL1 is TCP only
    (["--url", "tcp://127.0.0.1:3082", "--protocol", "cisco-tl1", "list"], "unknown switch protocol"),
    (["--url", "tcp://127.0.0.1:3082", "connect", "one", "17"], "not a number"),
    (["--url", "tcp://127.0.0.1:3082", "--allowed-ports", "9-2", "list"], "--allowed-ports"),
    (["--url", "tcp://127.0.0.1:3082", "apply", "1-17"], "expected IN:OUT"),
    (["--url", "tcp://127.0.0.1:3082", "--allowed-ports", "1-1000000000", "list"],  # was an OOM at 23.8 GB
     "goes beyond the switch's 8192 ports"),
    (["--url", "tcp://127.0.0.1:3082", "--size", "99999999x2", "list"], "--size"),
])
def test_bad_input_exit_2_with_one_line(argv, fragment, capsys):
    assert main(["ocs"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_unreachable_switch_is_one_line(capsys):
    assert main(["ocs", "--url", "tcp://127.0.0.1:1", "list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot connect" in err[0]


def test_writes_take_the_bench_lease_reads_do_not(servers, capsys):
    from harness.lock import BenchLease, endpoint_keys

    base = _tl1(servers)
    url = base[base.index("--url") + 1]
    run = BenchLease(endpoint_keys(url, "polatis-tl1"), run_id="a-run").acquire(keepalive=False)
    try:
        for action in (["connect", "2", "18"], ["disconnect", "2"], ["apply", "2:18"]):
            assert main(base + action) == 2
            err = capsys.readouterr().err
            assert "bench is locked" in err and "a-run" in err
        assert main(base + ["--json", "list"]) == 0
        assert "2" not in json.loads(capsys.readouterr().out)  # nothing was sent
    finally:
        run.release()
    assert main(base + ["connect", "2", "18"]) == 0 and main(base + ["disconnect", "2"]) == 0
