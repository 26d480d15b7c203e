"""`harness profile fit` on synthetic runs drawn from known distributions."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from devices.emulated.profile import load_profile
from harness.cli import main
from harness.eventlog import EventLog, to_parquet
from harness.events import Event

Z99 = stats.norm.ppf(0.99)
PORTS = [("gpu1", "ens1f0np0"), ("gpu1", "ens1f1np1"), ("gpu2", "ens1f0np0"), ("gpu2", "ens1f1np1")]
SLOW = "gpu2:ens1f1np1"


def lognormal_mean_p99(rng, mean, p99, size=None):
    gap = math.log(p99 / mean)
    sigma = Z99 - math.sqrt(Z99**2 - 2 * gap)
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, size)


def near(ci, value):
    """Within the 95 % CI widened by half its width (about 99.9 % coverage): the 95 % CI itself misses
    the truth one time in twenty by design; its coverage is tested in test_fit.py."""
    half = (ci[1] - ci[0]) / 2
    return ci[0] - half / 2 <= value <= ci[1] + half / 2


def write_run(run_dir, rng, cycles, parquet):
    run_dir.mkdir(parents=True)
    ms = 1_000_000
    with EventLog(run_dir / "events.jsonl") as log:
        for c in range(cycles):
            def ev(stage, host, port, t, ocs_port=-1):
                log.append(Event("r", c, stage, host, "dev", port, ocs_port, int(t), 0, 1000, "test"))
            sent = 10**13 * (c + 1)
            done = sent + lognormal_mean_p99(rng, 44.0, 64.0) * ms
            ev("ocs_command_sent", "harness", "ocs1", sent)
            ev("ocs_command_completed", "harness", "ocs1", done)
            for host, port in PORTS:
                t = done + 0.05 * ms
                ev("light_detected", host, port, t)
                t += rng.gamma(4.0, 0.5) * ms  # cdr_lock: gamma mean 2 ms, cv 0.5
                ev("cdr_locked", host, port, t)
                mean = 6000.0 if f"{host}:{port}" == SLOW else 5648.0
                t += lognormal_mean_p99(rng, mean, mean * 1.1163) * ms
                ev("phy_up", host, port, t)
                t += 20 * ms
                ev("port_active", host, port, t)
                ev("light_lost", host, port, t + 10**9)
                ev("port_down", host, port, t + 10**9 + ms)
            log.flush()
    if parquet:
        to_parquet(run_dir / "events.jsonl", run_dir / "events.parquet")
        (run_dir / "events.jsonl").unlink()  # parquet must be enough


def test_profile_fit_recovers_known_timing(tmp_path, capsys):
    rng = np.random.default_rng(42)
    write_run(tmp_path / "run-a", rng, 150, parquet=True)
    write_run(tmp_path / "run-b", rng, 150, parquet=False)  # unfinished run: JSONL only
    out = tmp_path / "fitted.yaml"
    assert main(["profile", "fit", str(tmp_path / "run-a"), str(tmp_path / "run-b"), "--out", str(out),
                 "--base", "mixnet-testbed"]) == 0
    printed = capsys.readouterr().out
    assert "ocs.switch: lognormal n=300" in printed
    profile = load_profile(str(out))
    report = json.loads((tmp_path / "fitted.yaml.fit.json").read_text())
    switch = report["ocs"]["switch"]
    assert switch["choice"] == "lognormal"
    assert near(switch["ci95"]["mean_ms"], 44.0) and near(switch["ci95"]["p99_ms"], 64.0)
    assert profile.ocs["switch"].mean_s * 1e3 == pytest.approx(44.0, rel=0.03)
    cdr = report["nic"]["cdr_lock"]
    assert cdr["choice"] == "gamma" and near(cdr["ci95"]["mean_ms"], 2.0) and near(cdr["ci95"]["cv"], 0.5)
    assert profile.nic["link_down"].spec == {"dist": "fixed", "ms": 1.0}
    assert profile.nic["port_active"].spec == {"dist": "fixed", "ms": 20.0}
    assert profile.ocs["dark"].spec == {"dist": "fixed", "ms": 0.2}  # from --base: not measurable
    # Only phy_up differs between ports (one slow port) -> per-port overrides for phy_up alone.
    assert report["port_tests"]["phy_up"]["per_port"] and not report["port_tests"]["cdr_lock"]["per_port"]
    slow = profile.nic_delay(SLOW, "phy_up").mean_s * 1e3
    fast = profile.nic_delay("gpu1:ens1f0np0", "phy_up").mean_s * 1e3
    assert slow == pytest.approx(6000.0, rel=0.01) and fast == pytest.approx(5648.0, rel=0.01)
    assert set(profile.per_port) == {f"{h}:{p}" for h, p in PORTS}
    assert profile.topology.hosts == 4


def test_profile_fit_input_errors(tmp_path, capsys):
    assert main(["profile", "fit", str(tmp_path / "missing"), "--out", str(tmp_path / "p.yaml")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text('{"broken": \n{"x": 1}\n')
    assert main(["profile", "fit", str(tmp_path / "run"), "--out", str(tmp_path / "p.yaml")]) == 2
    assert f"{tmp_path / 'run' / 'events.jsonl'}:1:" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()
