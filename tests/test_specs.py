"""Declared specs (harness/specs.py): one pass reports every problem of a file at its line, the semantic
ranges travel into the JSON Schemas, and the shipped schemas/ are the ones the models generate."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from harness.cli import main
from harness.commands.schema import SCHEMAS, render
from harness.config import load_inventory, load_playbook, load_yaml
from harness.errors import InputError
from tests.test_config import INVENTORY, write

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_shipped_schemas_are_the_generated_ones(kind):
    shipped = ROOT / "schemas" / f"{kind}.schema.json"
    assert shipped.read_text() == render(kind), f"regenerate: harness schema {kind} > schemas/{kind}.schema.json"


def test_an_inventory_reports_every_problem_at_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OCS_PASSWORD", "x")
    text = (INVENTORY.replace("size: [16, 16]", "size: [16, 0]")  # line 6
            .replace("    user: lab\n", "    user: lab\n    colour: red\n")  # line 15
            .replace("address: 192.0.2.22", "address: 192.0.2.22\n    port: 0")  # line 21
            .replace("ocs: ocs1, tx: 3", "ocs: ocs9, tx: 3"))  # line 23, found only by the cabling pass
    with pytest.raises(InputError) as info:
        load_inventory(write(tmp_path, "inv.yaml", text))
    got = [(e.line, e.message) for e in info.value.errors]
    assert got == [(6, "ocs.ocs1.size[1]: expected [ingress_count, egress_count] (integers 1..4096), found 0"),
                   (15, "hosts.gpu1: unknown key 'colour' (expected one of: user, identity_file, passphrase_env, "
                        "known_hosts, ssh_config, proxy_jump, become, tools, address, port, proxy_command, python, "
                        "nics)"),
                   (21, "hosts.gpu2.port: expected a port number in 1..65535, found 0"),
                   (23, "hosts.gpu2.nics[0].ocs: no switch named 'ocs9' (known: ocs1)")]
    # cabling problems alone, all of them
    text = INVENTORY.replace("ocs: ocs1, tx: 3", "ocs: ocs9, tx: 3").replace("rx: 18}", "rx: 17}")
    with pytest.raises(InputError) as info:
        load_inventory(write(tmp_path, "inv2.yaml", text))
    assert [(e.line, e.message.split(":")[0]) for e in info.value.errors] == [
        (17, "hosts.gpu1.nics[1].rx"), (21, "hosts.gpu2.nics[0].ocs")]


def test_a_playbook_reports_top_level_and_every_step_at_once(tmp_path, capsys):
    path = write(tmp_path, "pb.yaml", """\
        name: p
        cycles: 0
        steps:
          - type: turnaround
            udp_port: 70000
            watch_interval_us: 0
          - type: turnaround
            teardown_s: -1
            colour: red
        """)
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"harness: {path}:2: playbook.cycles: expected 1..10000000, found 0",
        f"harness: {path}:5: steps[0] (turnaround 'turnaround-1').udp_port: expected a port number in 1..65535, "
        "found 70000",
        f"harness: {path}:6: steps[0] (turnaround 'turnaround-1').watch_interval_us: expected a positive interval, "
        "found 0",
        f"harness: {path}:8: steps[1] (turnaround 'turnaround-2').teardown_s: expected a value >= 0, found -1",
        f"harness: {path}:9: steps[1] (turnaround 'turnaround-2'): unknown key 'colour' (expected one of: cycles, "
        "pattern, schedule, ports, watch_interval_us, ethtool_interval_us, probes, probe_interval_us, probe_gap_us, "
        "udp_port, cycle_timeout_s, settle_s, clock_resync_s, clock_warmup_s, clock_check_probes, ocs_timeout_s, "
        "retries, retry_backoff_s, teardown_s, late_report_ms, faults)"]


def test_the_schemas_carry_the_ranges_and_accept_every_shipped_file(tmp_path):
    """An editor with the schema flags what the harness refuses, and nothing a shipped file holds."""
    def validator(kind):
        return jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / f"{kind}.schema.json").read_text()))

    playbook = validator("playbook")
    for path in sorted((ROOT / "playbooks").glob("*.yaml")):
        data = json.loads(json.dumps(load_yaml(path).data))
        assert not list(playbook.iter_errors(data)), path
        load_playbook(path)  # and the harness accepts it too
    for bad, where in ((70000, "udp_port"), (0, "watch_interval_us"), (-1, "teardown_s"), ("fast", "retries")):
        errors = list(playbook.iter_errors({"name": "p", "steps": [{"type": "turnaround", where: bad}]}))
        assert errors, (where, bad)
    profile = validator("profile")
    for path in sorted((ROOT / "devices" / "profiles").glob("*.yaml")):
        assert not list(profile.iter_errors(json.loads(json.dumps(load_yaml(path).data)))), path
    for bad in ({"nic": {"phy_up": {"dist": "weibull"}}}, {"topology": {"hosts": 0}},
                {"faults": {"inject": [{"kind": "port_flap", "cycles": [1], "flaps": 0}]}}):
        assert list(profile.iter_errors(bad)), bad
    inventory = validator("inventory")
    data = json.loads(json.dumps(load_yaml(write(tmp_path, "inv.yaml", INVENTORY)).data))
    assert not list(inventory.iter_errors(data))
    data["hosts"][next(iter(data["hosts"]))]["port"] = 70000
    assert list(inventory.iter_errors(data))


def test_a_step_parameter_out_of_range_is_refused_before_any_run_directory(tmp_path, capsys):
    """spectrumx_verdict used to check its ranges when it ran, after the runner had made the run dir."""
    path = write(tmp_path, "pb.yaml", "name: p\nsteps:\n  - type: spectrumx_verdict\n    n_boot: 10\n")
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: steps[0] (spectrumx_verdict 'spectrumx_verdict-1').n_boot: expected at least 100 " \
           "resamples, found 10" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("step, needle", [
    ("link_failures\n    fail_pct: [10, 100]", "fail_pct[1]: expected a list of percentages in [0, 100), found 100"),
    ("link_failures\n    rounds: 0", "rounds: expected a value >= 1, found 0"),
    ("link_flaps\n    ops_before: 1", "ops_before: expected a value >= 2, found 1"),
    ("link_flaps\n    sample_us: 0", "sample_us: expected a value >= 1, found 0"),
])
def test_link_study_ranges_are_declared(tmp_path, step, needle):
    with pytest.raises(InputError) as info:
        load_playbook(write(tmp_path, "pb.yaml", f"name: p\nsteps:\n  - type: {step}\n"))
    assert info.value.line == 4 and needle in info.value.message, info.value.format()


BAD_PROFILE = """\
name: bad
source: a test
ocs:
  switch: {dist: lognormal, mean_ms: 10, p99_ms: 1000}
  dark: {dist: fixed, mean_ms: 3}
nic:
  phy_up: {dist: weibull, ms: 1}
topology: {hosts: 20, nics_per_host: 2}
tools: {ethtool: 6.1}
faults:
  inject:
    - {kind: ssh_drop}
    - {kind: port_flap, cycles: [1], flaps: 0, colour: red}
colour: red
"""


def test_a_profile_reports_every_problem_at_its_line(tmp_path, capsys):
    path = write(tmp_path, "bad.yaml", BAD_PROFILE)
    assert main(["validate", str(path)]) == 2
    lines = [line.removeprefix(f"harness: {path}:") for line in capsys.readouterr().err.splitlines()]
    assert lines == [
        "4: ocs.switch: p99/mean = 100.00 is too wide for a lognormal (max 15.0)",
        "5: ocs.dark: fixed takes ms; found mean_ms",
        "7: nic.phy_up.dist: expected one of 'fixed', 'lognormal', 'gamma', 'uniform' or 'empirical', "
        "found string 'weibull'",
        "8: topology: hosts·nics_per_host = 40 NIC ports do not fit a 16×16 switch (at most 16)",
        "9: tools.ethtool: expected a string, found number 6.1",
        "12: faults.inject[0]: give `cycles: [...]` or `probability: p`",
        "13: faults.inject[1].flaps: expected a value >= 1, found 0",
        "13: faults.inject[1].colour: unknown key 'colour' (expected one of: cycles, probability, kind, target, "
        "flaps, flap_ms)",
        "14: unknown key 'colour' (expected one of: name, description, source, copies, ocs, nic, per_port, hosts, "
        "topology, faults, tools, fabric)"]
    # the run refuses it the same way, before any run directory exists
    out = tmp_path / "run"
    pb = write(tmp_path, "pb.yaml", "name: p\nsteps:\n  - type: turnaround\n")
    assert main(["run", str(pb), "--bench", f"emulated:{path}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: ocs.switch: p99/mean" in err and "Traceback" not in err and not out.exists()


def test_fault_entries_are_declared_kinds_checked_at_load(tmp_path):
    path = write(tmp_path, "pb.yaml", """\
        name: p
        steps:
          - type: turnaround
            faults:
              - {kind: ssh_drop, cycles: [1], after_ms: -1}
              - kind: port_flap
                probability: 2
              - {kind: meteor}
              - {kind: harness_kill, cycles: [2], signal: SIGSEGV}
        """)
    with pytest.raises(InputError) as info:
        load_playbook(path)
    got = [(e.line, e.message.split(").", 1)[-1]) for e in info.value.errors]
    assert got == [(5, "faults[0].after_ms: expected a value >= 0, found -1"),
                   (7, "faults[1].probability: expected a probability in [0, 1], found 2"),
                   (8, "faults[2]: kind: expected one of 'ssh_drop', 'ocs_deny', 'ocs_silence', 'line_garbage', "
                       "'line_drop', 'port_never_up', 'port_flap', 'clock_step', 'slow_host', 'watch_stall', 'harness_kill', "
                       "'disk_full', found string 'meteor'"),
                   (9, "faults[3].signal: expected one of 'SIGKILL', 'SIGINT' or 'SIGTERM', found string 'SIGSEGV'")]


def test_one_delay_reading_for_emulator_and_analysis():
    """The emulator's Delay and the regret analysis read a delay mapping the same way (analysis/delays.py):
    the same quantiles, and the same refusal where no lognormal has the stated mean and p99 (the regret copy
    used to clamp sigma there and sample a distribution with another p99)."""
    import numpy as np

    from analysis.delays import Delay, Z99
    from analysis.regret import lognormal_from_mean_p99, switch_cost_from_profile
    from devices.emulated.profile import ProfileError, profile_from_dict

    spec = {"dist": "lognormal", "mean_ms": 44.0, "p99_ms": 64.0}
    emulated = profile_from_dict({"ocs": {"switch": spec}}).ocs["switch"]
    assert emulated.mean_s == pytest.approx(0.044) and emulated.quantile(0.99) == pytest.approx(0.064)
    drawn = switch_cost_from_profile({"ocs": {"switch": spec}}, 40_000, include_nic=False, seed=1)
    assert np.quantile(drawn, [0.5, 0.99]) == pytest.approx([emulated.quantile(0.5), 0.064], rel=0.02)
    wide = {"dist": "lognormal", "mean_ms": 10.0, "p99_ms": 10.0 * np.exp(Z99**2 / 2) * 1.01}
    with pytest.raises(ValueError, match="too wide"):
        Delay.from_spec(wide)
    with pytest.raises(ValueError, match="too wide"):
        lognormal_from_mean_p99(wide["mean_ms"], wide["p99_ms"], 10)
    with pytest.raises(ValueError, match="too wide"):
        switch_cost_from_profile({"ocs": {"switch": wide}}, 10)
    with pytest.raises(ProfileError, match="too wide"):
        profile_from_dict({"ocs": {"switch": wide}})


def test_verdict_parameters_and_the_sweep_block_report_every_problem_at_load(tmp_path):
    """mixnet_verdict checked verdict_delay and workers only when it ran (after the measurement); the sweep
    block stopped at its first problem."""
    path = write(tmp_path, "pb.yaml", """\
        name: p
        steps:
          - type: turnaround
            name: measure
          - type: mixnet_verdict
            models: [gpt-5]
            verdict_delay: nic
            workers: 0
            baseline: {gpu: h200, mfu: 1.5}
            grid: {skew: [], depth: [1]}
        sweep:
          grid:
            measure.nope: [1]
            cycles: [0]
          seeds: [1, 1]
        """)
    with pytest.raises(InputError) as info:
        load_playbook(path)
    got = [(e.line, e.message.replace("steps[1] (mixnet_verdict 'mixnet_verdict-2').", "")) for e in info.value.errors]
    assert got == [
        (6, "models[0]: expected one of 'mixtral-8x7b', 'mixtral-8x22b', 'qwen1.5-moe-a2.7b', 'deepseek-moe-16b' or "
            "'llama-moe-3.5b', found string 'gpt-5'"),
        (7, "verdict_delay: expected one of 'ocs' or 'total', found string 'nic'"),
        (8, "workers: expected a value >= 1, found 0"),
        (9, "baseline.gpu: expected one of 'h100-sxm' or 'a100-sxm', found string 'h200'"),
        (9, "baseline.mfu: expected a value in (0, 1], found 1.5"),
        (10, "grid.skew: expected at least one value, found []"),
        (10, "grid: unknown key 'depth' (expected one of: gpu, skew, mfu, overlap, greedy, alpha)"),
        (15, "playbook.sweep.seeds: a seed is listed twice")]
    with pytest.raises(InputError) as info:  # the verdict fixed: the sweep's cross-checks, all of them
        load_playbook(write(tmp_path, "pb2.yaml", path.read_text().split("  - type: mixnet_verdict")[0] +
                            "sweep:\n  grid:\n    measure.nope: [1]\n    cycles: [0]\n"))
    assert [(e.line, e.message.split(":")[0]) for e in info.value.errors] == [
        (7, "sweep.grid.measure.nope"), (8, "sweep.grid.cycles[0]")]
