"""Bench lock: leases with owner and expiry — contention, expiry, a crashed holder, keep-alive, takeover,
and the runner refusing a locked OCS on a real inventory (and releasing its own lease)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from devices.emulated.bench import EmulatedBench
from devices.emulated.profile import profile_from_dict
from harness.cli import main
from harness.lock import LOCK_DIR_ENV, TTL_ENV, BenchLease, BenchLocked, endpoint_keys, read_lease

(KEY,) = endpoint_keys("tcp://192.0.2.10:3082", "polatis-tl1")


def test_second_run_is_refused_and_told_who_holds_it(tmp_path):
    first = BenchLease([KEY], run_id="run-A", directory=tmp_path).acquire(keepalive=False)
    with pytest.raises(BenchLocked) as info:
        BenchLease([KEY], run_id="run-B", directory=tmp_path).acquire(keepalive=False)
    assert "run-A" in str(info.value) and first.owner in str(info.value)
    first.release()
    assert not (tmp_path / f"{KEY}.json").exists()
    BenchLease([KEY], run_id="run-B", directory=tmp_path).acquire(keepalive=False).release()


def test_all_or_nothing_over_several_switches(tmp_path):
    (other,) = endpoint_keys("tcp://192.0.2.11:3082", "polatis-tl1")
    holder = BenchLease([other], directory=tmp_path).acquire(keepalive=False)
    with pytest.raises(BenchLocked):
        BenchLease([KEY, other], directory=tmp_path).acquire(keepalive=False)
    assert not (tmp_path / f"{KEY}.json").exists()  # the free one was not left held
    holder.release()


def test_same_switch_under_two_names_collides():
    assert endpoint_keys("tcp://192.0.2.10:3082", "polatis-tl1") == endpoint_keys("TCP://192.0.2.10:3082 ", "polatis-tl1")


def test_one_switch_under_two_host_names_shares_one_lease(tmp_path):
    """Issue 38, reproduction 1: `tcp://localhost:P` and `tcp://127.0.0.1:P` are one switch: the second
    lease is refused (the key is the resolved endpoint, never the URL text)."""
    first = BenchLease(endpoint_keys("tcp://127.0.0.1:3082", "polatis-tl1"), directory=tmp_path)
    first.acquire(keepalive=False)
    with pytest.raises(BenchLocked):
        BenchLease(endpoint_keys("tcp://localhost:3082", "polatis-tl1"), directory=tmp_path).acquire(keepalive=False)
    with pytest.raises(BenchLocked):
        BenchLease(endpoint_keys("tcp://[::ffff:127.0.0.1]:3082", "polatis-tl1"),
                   directory=tmp_path).acquire(keepalive=False)
    BenchLease(endpoint_keys("tcp://127.0.0.1:3083", "polatis-tl1"), directory=tmp_path).acquire(keepalive=False)
    first.release()


def test_an_expired_lease_is_taken_over(tmp_path):
    stale = BenchLease([KEY], run_id="old", ttl_s=1.0, directory=tmp_path)
    stale.acquire(keepalive=False)
    # Pretend the holder is on another machine (so only the expiry can free it), then let it expire.
    path = tmp_path / f"{KEY}.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "hostname": "elsewhere"}))
    with pytest.raises(BenchLocked):
        BenchLease([KEY], directory=tmp_path).acquire(keepalive=False)
    time.sleep(1.05)
    new = BenchLease([KEY], run_id="new", directory=tmp_path).acquire(keepalive=False)
    assert read_lease(path)["run_id"] == "new"
    stale.renew()
    assert stale.lost and "taken over" in stale.lost
    stale.release()  # does not remove the new holder's lease
    assert read_lease(path)["token"] == new.token
    new.release()


def test_a_crashed_holder_on_this_machine_does_not_block(tmp_path):
    code = ("import sys; from harness.lock import BenchLease; "
            f"BenchLease([{KEY!r}], run_id='crashed', ttl_s=3600, directory={str(tmp_path)!r})"
            ".acquire(keepalive=False); sys.exit(0)")  # exits without releasing, like a SIGKILL
    subprocess.run([sys.executable, "-c", code], check=True)
    assert read_lease(tmp_path / f"{KEY}.json")["run_id"] == "crashed"
    BenchLease([KEY], run_id="next", directory=tmp_path).acquire(keepalive=False).release()


def test_keepalive_renews_before_expiry(tmp_path):
    with BenchLease([KEY], ttl_s=1.0, directory=tmp_path) as held:
        path = tmp_path / f"{KEY}.json"
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "hostname": "elsewhere"}))  # only expiry could free it
        time.sleep(2.2)  # two ttl: only renewals (every ttl/3) keep it
        with pytest.raises(BenchLocked):
            BenchLease([KEY], directory=tmp_path).acquire(keepalive=False)
        assert held.lost is None


def test_concurrent_acquires_have_one_winner(tmp_path):
    winners, barrier = [], threading.Barrier(8)

    def attempt(i):
        barrier.wait()
        try:
            BenchLease([KEY], run_id=str(i), directory=tmp_path).acquire(keepalive=False)
            winners.append(i)
        except BenchLocked:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert read_lease(tmp_path / f"{KEY}.json")["run_id"] == str(winners[0])


PROFILE = {"name": "lock", "ocs": {"switch": {"dist": "fixed", "ms": 2}},
           "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]}}


def test_runner_refuses_a_locked_ocs_and_releases_its_own_lease(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench") as bench:
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        inventory["bench"]["emulated"] = False  # a "real" bench: locked, strict host keys
        real = tmp_path / "real.yaml"
        real.write_text(yaml.safe_dump(inventory))
        (key,) = endpoint_keys(inventory["ocs"]["ocs1"]["url"], "polatis-tl1")
        pb = tmp_path / "pb.yaml"
        pb.write_text(yaml.safe_dump({"name": "l", "cycles": 2, "steps": [
            {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10}]}))
        out = tmp_path / "runs"
        other = BenchLease([key], run_id="someone-else").acquire(keepalive=False)
        assert main(["run", str(pb), "--bench", str(real), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "bench is locked" in err and "someone-else" in err and "Traceback" not in err
        assert not out.exists()  # refused before anything was created or touched
        assert main(["run", str(pb), "--bench", str(real), "--out", str(out), "--dry-run"]) == 0  # touches nothing
        other.release()
        assert main(["run", str(pb), "--bench", str(real), "--out", str(out), "-q"]) == 0
        assert not (Path(tmp_path / "locks") / f"{key}.json").exists()


def test_a_run_whose_lease_is_taken_over_stops_and_restores(tmp_path):
    locks = tmp_path / "locks"
    with EmulatedBench(profile_from_dict(PROFILE), seed=2, workdir=tmp_path / "bench") as bench:
        # after the bench started: it sets the password variable its inventory names (the child run reads it)
        env = {**os.environ, LOCK_DIR_ENV: str(locks), TTL_ENV: "0.6"}
        original = bench.physics.ocs_patches()
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        inventory["bench"]["emulated"] = False
        real = tmp_path / "real.yaml"
        real.write_text(yaml.safe_dump(inventory))
        (key,) = endpoint_keys(inventory["ocs"]["ocs1"]["url"], "polatis-tl1")
        pb = tmp_path / "pb.yaml"
        pb.write_text(yaml.safe_dump({"name": "l", "cycles": 500, "steps": [
            {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10}]}))
        out = tmp_path / "runs"
        proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(pb), "--bench", str(real), "--out",
                                 str(out / "run"), "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        end = time.monotonic() + 60
        while not list(out.glob("*/events.jsonl")) or not list(out.glob("*/events.jsonl"))[0].stat().st_size:
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read().decode()
            time.sleep(0.05)
        # an operator (wrongly) breaks the lock and takes the switch over
        intruder = {"owner": "intruder@elsewhere pid 1", "hostname": "elsewhere", "pid": 1, "run_id": "theirs",
                    "token": "0" * 16, "expires": time.time() + 3600}
        (locks / "intruder.tmp").write_text(json.dumps(intruder))  # atomically, as a lease is written
        os.replace(locks / "intruder.tmp", locks / f"{key}.json")
        assert proc.wait(timeout=60) == 1, proc.stderr.read().decode()
        (run,) = list(out.iterdir())
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["status"] == "broken" and "taken over by intruder@elsewhere" in manifest["extra"]["broken"]
        assert manifest["extra"]["restored"] == {"ocs1": True} and bench.physics.ocs_patches() == original
        assert read_lease(locks / f"{key}.json")["run_id"] == "theirs"  # ours is gone, theirs is left alone


def test_runner_refuses_a_switch_leased_under_another_name(tmp_path, monkeypatch, capsys):
    """Issue 38, reproduction 1 end to end: a run through `localhost` while the switch is leased through
    `127.0.0.1` is refused before it touches anything."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench") as bench:
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        inventory["bench"]["emulated"] = False
        url = inventory["ocs"]["ocs1"]["url"]
        assert "127.0.0.1" in url
        inventory["ocs"]["ocs1"]["url"] = url.replace("127.0.0.1", "localhost")
        alias = tmp_path / "alias.yaml"
        alias.write_text(yaml.safe_dump(inventory))
        pb = tmp_path / "pb.yaml"
        pb.write_text(yaml.safe_dump({"name": "l", "cycles": 2, "steps": [
            {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10}]}))
        other = BenchLease(endpoint_keys(url, "polatis-tl1"), run_id="someone-else").acquire(keepalive=False)
        try:
            assert main(["run", str(pb), "--bench", str(alias), "--out", str(tmp_path / "runs")]) == 2
        finally:
            other.release()
        err = capsys.readouterr().err
        assert "bench is locked" in err and "someone-else" in err


def test_a_switch_s_identity_is_a_lease_key_where_its_answer_carries_a_serial(tmp_path):
    """Two routes to one unit that no resolver relates (two management addresses) meet on its serial."""
    from harness.lock import ocs_identity_key

    idn = "Polatis,6000,SN012345,7.1"
    key = ocs_identity_key("polatis-scpi", idn)
    assert key and key == ocs_identity_key("polatis-netconf", " Polatis, 6000 ,SN012345, 8.0")
    assert ocs_identity_key("polatis-scpi", "Polatis,6000,SN012346,7.1") != key
    assert ocs_identity_key("polatis-tl1", '"POLATIS,EMU-8x8,OXC,1.0"') is None  # no serial in RTRV-NETYPE
    assert ocs_identity_key("polatis-scpi", "Polatis,6000,0,1") is None
    first = BenchLease(endpoint_keys("tcp://192.0.2.10:5025", "polatis-scpi"), directory=tmp_path)
    first.acquire(keepalive=False)
    first.add(key)
    second = BenchLease(endpoint_keys("tcp://192.0.2.99:5025", "polatis-scpi"), directory=tmp_path)
    second.acquire(keepalive=False)  # another address: its endpoint is free...
    with pytest.raises(BenchLocked):
        second.add(key)  # ...but not the unit
    first.release()
    second.add(key)
    second.release()


def test_a_run_leases_the_switch_by_its_serial_and_is_refused_when_the_unit_is_held(tmp_path, monkeypatch, capsys):
    """An SCPI switch answers *IDN? with its serial: a run takes that lease too, so a run holding the unit
    under another address (here: held by its identity key alone) refuses this one before the snapshot."""
    from harness.lock import ocs_identity_key

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, protocol="polatis-scpi",
                       workdir=tmp_path / "bench") as bench:
        original = bench.physics.ocs_patches()
        servers = bench.ocs_servers
        n, m = bench.physics.ocs_size
        key = ocs_identity_key("polatis-scpi", f"Polatis,EMU-{n}x{m},{servers.serial},{servers.version}")
        assert key is not None
        pb = tmp_path / "pb.yaml"
        pb.write_text(yaml.safe_dump({"name": "l", "cycles": 1, "steps": [
            {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10, "probes": False}]}))
        other = BenchLease([key], run_id="elsewhere").acquire(keepalive=False)
        try:
            code = main(["run", str(pb), "--bench", str(bench.inventory_path), "--out", str(tmp_path / "a"), "-q"])
        finally:
            other.release()
        err = capsys.readouterr().err
        assert code != 0 and "in use under another address" in err and "elsewhere" in err, err
        assert bench.physics.ocs_patches() == original  # refused before anything moved
        assert main(["run", str(pb), "--bench", str(bench.inventory_path), "--out", str(tmp_path / "b"), "-q"]) == 0
        assert not list((tmp_path / "locks").glob("ocs-id-*.json")) and not list(
            (tmp_path / "locks").glob("*.pending.json"))  # released, and no note left by a clean run
