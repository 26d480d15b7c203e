"""`--bench emulated:PROFILE?ocs=PROTOCOL`: the emulated switch served over any registered protocol."""
from __future__ import annotations

import pytest
import yaml

from harness.config import InputError
from harness.benchspec import emulated_spec


def test_emulated_spec_parses_the_protocol_choice():
    assert emulated_spec("emulated:instant") == ("emulated", "instant", "polatis-tl1")
    assert emulated_spec("emulated:instant?ocs=polatis-scpi") == ("emulated", "instant", "polatis-scpi")
    assert emulated_spec("emulated-netns:burst-mode?ocs=polatis-tl1") == ("emulated-netns", "burst-mode",
                                                                         "polatis-tl1")
    assert emulated_spec("bench.yaml") is None
    for bad in ("emulated:instant?ocs=cisco", "emulated:instant?switch=scpi", "emulated:?ocs=polatis-scpi",
                "emulated:instant?ocs=polatis-scpi&ocs=polatis-tl1"):
        with pytest.raises(InputError, match="--bench"):
            emulated_spec(bad)


def test_a_run_drives_the_scpi_switch(tmp_path, run_playbook):
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "scpi", "bench": "emulated:burst-mode", "cycles": 1, "seed": 1,
                                  "steps": [{"type": "turnaround", "name": "measure", "probes": False,
                                             "clock_warmup_s": 0.1, "cycle_timeout_s": 20}]}))
    result = run_playbook(pb, bench="emulated:burst-mode?ocs=polatis-scpi")
    assert result.exit_code == 0, result
    run = result.run_dir
    inventories = list(run.rglob("inventory*.yaml"))
    assert inventories and all(yaml.safe_load(p.read_text())["ocs"]["ocs1"]["protocol"] == "polatis-scpi"
                               for p in inventories)
    assert result.manifest()["extra"]["bench"] == "emulated:burst-mode?ocs=polatis-scpi"
    refused = run_playbook(pb, bench="emulated:instant?ocs=nope")
    assert refused.exit_code == 2 and "unknown switch protocol 'nope'" in refused.error
