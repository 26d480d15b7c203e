"""A host's SSH sessions and OpenSSH's MaxSessions (10 by default), on hosts of 8 NICs (a DGX's count) of the
emulated bench, whose hosts refuse the eleventh session at once as sshd does (tests/test_ssh_lab.py holds the
emulated host to the real sshd there):
- a turnaround with probes keeps within one connection: one probe sender and one receiver per host, not one per
  port (a sender per port made 11 sessions on such a host, and the run stopped at its first command);
- a MoE traffic phase runs a command per NIC at once, 8 on a host beside the harness's own streams: the sessions
  the host refuses go on a second connection to it (the run failed at its first phase before)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from devices.emulated.host import server as host_server
from devices.emulated.profile import load_profile
from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
def _write_profile(path: Path) -> Path:
    """The shipped `instant` profile over two hosts of 8 NICs."""
    data = yaml.safe_load(Path(load_profile("instant").path).read_text())
    data["topology"] = {"hosts": 2, "nics_per_host": 8, "ocs_size": [16, 16]}
    path.write_text(yaml.safe_dump(data))
    return path


def _count_sessions(monkeypatch) -> dict[tuple[str, int], int]:
    """(host, connection) -> the most sessions it had open at once (the one asked for included)."""
    peak: dict[tuple[str, int], int] = {}
    check = host_server.SshServer.check_channel_request

    def counted(self, kind, chanid):
        key = (self.host.host_name, id(self))
        peak[key] = max(peak.get(key, 0), len(self.transport._channels) + 1)  # noqa: SLF001
        return check(self, kind, chanid)

    monkeypatch.setattr(host_server.SshServer, "check_channel_request", counted)
    return peak


def test_a_turnaround_with_probes_on_hosts_of_eight_nics_keeps_within_max_sessions(tmp_path, monkeypatch):
    peak = _count_sessions(monkeypatch)
    _write_profile(tmp_path / "p.yaml")
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump({
        "name": "eight", "bench": f"emulated:{tmp_path / 'p.yaml'}", "seed": 1, "cycles": 2,
        "steps": [{"type": "turnaround", "name": "measure", "clock_warmup_s": 0.1, "probes": True,
                   "cycle_timeout_s": 20}]}))
    code = main(["run", str(tmp_path / "pb.yaml"), "--out", str(tmp_path / "run"), "-q"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert code == 0, summary
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["stage"] == "fault"]
    assert {e["port"] for e in events if e["stage"] == "first_packet"} == {f"ens{i}f0np0" for i in range(1, 9)}
    assert peak and max(peak.values()) <= host_server.MAX_SESSIONS - 3, peak  # room for commands at once (5 seen)
    assert sorted(host for host, _ in peak) == ["gpu1", "gpu2"]  # one connection each


def test_a_moe_traffic_phase_of_eight_commands_a_host_takes_a_second_connection(tmp_path, monkeypatch):
    peak = _count_sessions(monkeypatch)
    _write_profile(tmp_path / "p.yaml")
    playbook = yaml.safe_load((ROOT / "playbooks" / "moe-traffic.yaml").read_text())
    playbook["bench"] = f"emulated:{tmp_path / 'p.yaml'}"
    playbook["steps"][0].update(iterations=1, layers=1, regime_changes=0)
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump(playbook))
    code = main(["run", str(tmp_path / "pb.yaml"), "--out", str(tmp_path / "run"), "-q"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert code == 0 and summary["outcome"] == "completed", summary
    connections = {host: sum(1 for h, _ in peak if h == host) for host, _ in peak}
    assert connections == {"gpu1": 2, "gpu2": 2}, peak
    assert max(peak.values()) == host_server.MAX_SESSIONS + 1, peak  # the one refused, counted as asked for
