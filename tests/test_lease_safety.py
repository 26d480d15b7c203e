"""The bench lease is kept by the circuit guard, not by each step: once another run takes the lease over, the
next change any step asks for is refused, the run is latched broken and the bench is still put back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from devices.emulated.bench import EmulatedBench
from devices.emulated.profile import load_profile
from devices.ocs.fake import FakeSwitch
from devices.resources import OcsResource
from harness.bench import BenchBroken
from harness.bench.circuits import CircuitGuard
from harness.cli import main
from harness.lock import LOCK_DIR_ENV, BenchLease, endpoint_keys, read_lease

INTRUDER = {"owner": "intruder@elsewhere pid 1", "hostname": "elsewhere", "pid": 1, "run_id": "theirs",
            "token": "0" * 16}


def _take_over(lease: BenchLease) -> None:
    """Another run (wrongly) breaks the lock and takes the switch: written atomically, as a lease is."""
    import time

    for key in lease.keys:
        tmp = lease.directory / f"{key}.intruder.tmp"
        tmp.write_text(json.dumps({**INTRUDER, "expires": time.time() + 3600}))
        tmp.replace(lease.directory / f"{key}.json")
    lease.renew()  # what the keep-alive finds at its next tick


def test_a_guard_refuses_every_change_but_the_restore_once_the_lease_is_lost(tmp_path):
    ocs = OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                      allowed_ports=frozenset(range(1, 17)))
    switch = FakeSwitch(ocs)
    lease = BenchLease(["k"], directory=tmp_path).acquire(keepalive=False)
    latched: list[str] = []
    guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, lease=lease, on_broken=latched.append)
    original = switch.patches()
    guard.apply({1: 9, 2: 10})
    assert switch.patches()[1] == 9
    _take_over(lease)
    with pytest.raises(BenchBroken, match="taken over by intruder@elsewhere"):
        guard.apply({1: 10, 2: 9})
    with pytest.raises(BenchBroken):
        guard.begin({1: 10, 2: 9})
    assert switch.patches()[1] == 9  # nothing was sent
    assert len(latched) == 2 and "bench lock lost" in latched[0]
    assert guard.restore().restored and switch.patches() == original  # the way back is never refused


SMALL = {"trace": "generate", "iterations": 3, "layers": 1, "regime_changes": [1], "tokens_per_micro_batch": 1024,
         "hidden_size": 1024}


@pytest.mark.parametrize("step", [
    {"type": "moe_traffic", "name": "moe", "reconfigure": "per_iteration", **SMALL},
    {"type": "link_failures", "name": "failures", "pull": "circuits", "fail_pct": [50], **SMALL,
     "regime_changes": 0}],
    ids=["moe_traffic", "link_failures"])
def test_a_step_whose_lease_is_taken_over_is_refused_its_next_change_and_the_bench_restored(
        step, tmp_path, monkeypatch):
    """Every step that moves circuits inherits the refusal: the lease is lost right after the step's first
    change, its next change never reaches the switch, the run ends broken and the switch shows what it had."""
    locks = tmp_path / "locks"
    monkeypatch.setenv(LOCK_DIR_ENV, str(locks))
    applied, refused = [], []
    begin = CircuitGuard.begin

    def spying_begin(self, mapping, *args, **kwargs):
        if not kwargs.get("restoring") and applied:
            _take_over(self.lease)
        try:
            command = begin(self, mapping, *args, **kwargs)
        except BenchBroken as exc:
            refused.append(str(exc))
            raise
        if not kwargs.get("restoring"):
            applied.append(dict(mapping))
        return command

    monkeypatch.setattr(CircuitGuard, "begin", spying_begin)
    with EmulatedBench(load_profile("burst-mode"), seed=4, workdir=tmp_path / "bench") as bench:
        original = bench.physics.ocs_patches()
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        inventory["bench"]["emulated"] = False  # a bench that is leased
        real = tmp_path / "real.yaml"
        real.write_text(yaml.safe_dump(inventory))
        book = tmp_path / "pb.yaml"
        book.write_text(yaml.safe_dump({"name": "lease", "seed": 3, "cycles": 1,
                                        "steps": [step, {**step, "name": "after"}]}))
        out = tmp_path / "run"
        assert main(["run", str(book), "--bench", str(real), "--out", str(out), "-q"]) == 1
        manifest = json.loads((out / "manifest.json").read_text())
        assert len(applied) == 1 and len(refused) == 1 and "taken over by intruder@elsewhere" in refused[0]
        assert manifest["status"] == "broken" and "bench lock lost" in manifest["extra"]["broken"]
        assert manifest["extra"]["restored"] == {"ocs1": True} and bench.physics.ocs_patches() == original
        after = json.loads((out / "summary.json").read_text())["summary"]["steps"]["after"]
        assert [c["name"] for c in after["checks"]] == ["skipped: the bench is latched broken"]
        for key in endpoint_keys(inventory["ocs"]["ocs1"]["url"], inventory["ocs"]["ocs1"]["protocol"]):
            assert read_lease(Path(locks) / f"{key}.json")["run_id"] == "theirs"  # theirs is left alone


def test_a_fabric_study_whose_lease_is_taken_over_shuts_no_more_links_and_opens_those_it_shut(tmp_path, monkeypatch):
    """A leaf–spine link shut by command is a change like a circuit: once the lease is lost the next shut is
    refused, the run ends broken, and every link the study shut is opened again."""
    from devices.emulated import leafspine
    from harness.steps.linkfail import LinkStudy

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    shut, set_fabric = [], LinkStudy.set_fabric

    def spying_set_fabric(self, links, state):
        if state == "down" and shut:
            _take_over(self.ctx.lease)
        out = set_fabric(self, links, state)
        if state == "down":
            shut.append(list(links))
        return out

    monkeypatch.setattr(LinkStudy, "set_fabric", spying_set_fabric)
    with EmulatedBench(load_profile("burst-mode"), seed=4, workdir=tmp_path / "bench") as bench:
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        inventory["bench"]["emulated"] = False  # a bench that is leased
        real = tmp_path / "real.yaml"
        real.write_text(yaml.safe_dump(inventory))
        book = tmp_path / "pb.yaml"
        book.write_text(yaml.safe_dump({"name": "lease", "seed": 3, "cycles": 1, "steps": [
            {"type": "link_failures", "name": "failures", "fail_pct": [25], "rounds": 3, "planes": 2,
             "per_leaf": 4, "spines": 2, **SMALL, "regime_changes": 0, "max_phases": 1}]}))
        out = tmp_path / "run"
        assert main(["run", str(book), "--bench", str(real), "--out", str(out), "-q"]) == 1
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "broken" and "bench lock lost" in manifest["extra"]["broken"]
        assert len(shut) == 1 and shut[0]  # the first round's links, and no later round's
        links = leafspine.links_of(bench.physics, 0.0)
        assert links.spans and all(spans[-1][1] is not None for spans in links.spans.values())  # all opened
