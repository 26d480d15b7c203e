"""Shared fixtures: one emulated host reachable over real SSH, per test module."""
from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.emulated.host.server import EmulatedHostServer
from devices.ssh import SshTransport

# Compiled modules are cached for the suite's own processes even where the environment turns the cache off
# (PYTHONDONTWRITEBYTECODE): each xdist worker would otherwise assert-rewrite every test and project module
# (~5 s of CPU per worker), and each `harness` subprocess compile the project again. The initial conftest is
# read before xdist starts its workers, so they and every subprocess inherit this.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The suite runs property tests derandomized, the same examples every time, so a red run is a real failure and
# reproducible: it was only with CI set, and a fresh clone's `.ci/run` drew new examples each time (one found a
# bug on the final run of a session). Explore new examples with HYPOTHESIS_PROFILE=explore, and pin what they
# find as a plain test.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path_factory, monkeypatch):
    """Bench leases per test: emulated OCS ports are reused across tests, a stale lease must not leak."""
    monkeypatch.setenv("OCS_HIL_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))


@pytest.fixture(scope="module")
def bench():
    with OpticalBench(load_profile("instant"), seed=3) as b:
        yield b


@pytest.fixture(scope="module")
def server(bench):
    with EmulatedHostServer(bench, bench.hosts[0]) as s:
        yield s


@pytest.fixture(scope="module")
def ssh(server):
    with SshTransport(server.resource()) as t:
        yield t


@pytest.fixture(scope="session")
def falsify_run(tmp_path_factory):
    """The main job's shape, small: a turnaround measured, then MixNet's claims judged; its HTML page and its
    JUnit file written. Read-only for the tests that share it (the HTML report's and the exports')."""
    import yaml

    from harness.cli import main

    tmp = tmp_path_factory.mktemp("falsify")
    playbook = tmp / "falsify.yaml"
    playbook.write_text(yaml.safe_dump({
        "name": "falsify", "bench": "emulated:instant", "seed": 3, "cycles": 2,
        "steps": [{"type": "turnaround", "name": "measure", "clock_warmup_s": 0.2},
                  {"type": "mixnet_verdict", "name": "verdict", "models": ["mixtral-8x22b"], "links_gbps": [100],
                   "n_boot": 20, "n_reps": 2, "grid": {"gpu": ["h100-sxm"]}, "workers": 1}]}))
    junit = tmp / "out" / "junit.xml"
    junit.parent.mkdir()
    assert main(["run", str(playbook), "--out", str(tmp / "run"), "-q", "--junit", str(junit)]) == 0
    assert main(["report", str(tmp / "run"), "--html"]) == 0
    return tmp / "run", junit
