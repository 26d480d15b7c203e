"""The bench runtime a step is handed (`ctx.live`), through its test double: one step's logic in milliseconds,
no emulator, and the safety rules every step inherits from the runtime's circuits."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from devices.resources import Bench, OcsResource
from harness.bench import BenchBroken
from harness.bench.fake import fake_run
from harness.steps.spectrumx import SpectrumxParams, spectrumx_verdict

OCS = OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                  allowed_ports=frozenset(range(1, 17)))
LAB = Bench(name="lab-x", emulated=False, ocs={"ocs1": OCS}, hosts={}, nic_ports=())
STEP = SimpleNamespace(name="verdict", type="spectrumx_verdict", file="pb.yaml", line=3,
                       params=SpectrumxParams().model_dump())


def _profile(copies=None):
    return SimpleNamespace(name="burst-mode", source=" lab notes ", copies=copies,
                           fabric_detection=SimpleNamespace(mean_s=0.002), fabric_source="assumed: 2 ms")


@pytest.mark.parametrize("truth, emulated, words, detection_ms, data_plane", [
    (None, False, {"falsified": "falsified", "holds": "holds"}, None, "measured by the transfer tool on bench lab-x"),
    (SimpleNamespace(profile=_profile()), True,
     {"falsified": "inconsistent with the emulator's model", "holds": "consistent with the emulator's model"}, 2.0,
     "emulated: "),
    (SimpleNamespace(profile=_profile(copies="MixNet Fig. 9")), True,
     {"falsified": "inconsistent with the paper's own measured figures",
      "holds": "consistent with the paper's own measured figures"}, 2.0, "emulated: "),
])
def test_a_verdict_step_words_its_claims_by_the_bench_it_was_handed(tmp_path, truth, emulated, words, detection_ms,
                                                                    data_plane):
    """Words follow provenance: a real bench (truth None) → falsified/holds; the emulator's model, or a profile
    copying a paper's figures → (in)consistent with it. Through the public facets only: no run, no emulator."""
    ctx = fake_run(LAB, tmp_path, truth=truth)
    outcome = spectrumx_verdict(ctx, STEP)
    prov = json.loads((tmp_path / "verdict.json").read_text())["provenance"]
    assert outcome.ok and prov["emulated"] is emulated and prov["bench"] == "lab-x"
    assert prov["words"] == words
    assert prov["detection"]["ms"] == detection_ms and prov["data_plane"].startswith(data_plane)
    assert (prov["profile"] == "burst-mode") is emulated


class _Lease:
    lost = None


def test_the_circuits_a_step_is_handed_refuse_a_change_once_the_lease_is_lost_and_are_restored(tmp_path):
    """The rule lives in the runtime, so every step has it: lease taken over → the next apply is refused
    (BenchBroken, the run latched broken), and the run's teardown still puts the switch back."""
    lease = _Lease()
    ctx = fake_run(LAB, tmp_path, lease=lease)
    switch = ctx.switch("ocs1")
    switch.apply({1: 9})
    found = switch.patches()
    guard = ctx.live.circuits("ocs1")
    assert ctx.live.circuits("ocs1") is guard  # one guard per switch and run
    guard.apply({3: 12})
    assert switch.patches()[3] == 12
    lease.lost = "taken over by theirs"
    with pytest.raises(BenchBroken, match="bench lock lost"):
        guard.apply({5: 14})
    assert 5 not in switch.patches() and "bench lock lost" in ctx.broken
    ctx.teardown.close()
    assert switch.patches() == found and ctx.manifest_extra["restored"] == {"ocs1": True}


def test_a_fake_run_refuses_hosts_it_was_not_given(tmp_path):
    ctx = fake_run(LAB, tmp_path, sessions={"h1": "session-h1"})
    assert ctx.live.hosts.open(["h1"]) == {"h1": "session-h1"}
    with pytest.raises(KeyError, match="h2"):
        ctx.live.hosts.session("h2")
