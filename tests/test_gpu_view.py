"""The GPUs' side of a reconfiguration (harness/gpu_view.py): on an emulated bench whose hosts run a job that
stalls while any of its NIC ports is not ACTIVE, the turnaround step's `nvidia-smi` samples show the GPUs idle
inside every re-training window and busy outside — the emulator's rule, checked against its own port truth."""
from __future__ import annotations

import json

import pandas as pd
import yaml

from devices.emulated.host.gpu import GPU_BUSY, GPU_STALLED
from devices.errors import TransportClosed
from devices.timing import now_ns
from harness import gpu_view

SLOW_NIC = {  # links take ~0.17 s to re-train
    "name": "gpu-view", "description": "test", "source": "a test fixture",
    "ocs": {"switch": {"dist": "fixed", "ms": 5.0}, "dark": {"dist": "fixed", "ms": 0.0}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.0}, "cdr_lock": {"dist": "fixed", "ms": 0.0},
            "phy_up": {"dist": "fixed", "ms": 120.0}, "port_active": {"dist": "fixed", "ms": 50.0},
            "link_down": {"dist": "fixed", "ms": 0.0}},
    "hosts": {"clock_offset_ms": [-2, 2], "drift_ppm": [-5, 5]},
    "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]},
}


def test_turnaround_records_gpus_idle_while_the_network_retrains(tmp_path, monkeypatch, run_playbook):
    monkeypatch.setattr(gpu_view, "INTERVAL_S", 0.05)  # several samples inside each ~0.17 s window
    profile = tmp_path / "gpu-view.yaml"
    profile.write_text(yaml.safe_dump(SLOW_NIC))
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "t", "bench": f"emulated:{profile}", "seed": 3, "cycles": 2, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.1, "probes": False,
         "settle_s": 0.25}]}))
    result = run_playbook(pb, bench=f"emulated:{profile}")
    assert result.exit_code == 0, result
    run = result.run_dir
    samples = pd.read_json(run / "gpu_samples.jsonl", lines=True)
    assert set(samples.host) == {"gpu1", "gpu2"} and set(samples.gpu) == set(range(8))
    assert set(samples.utilization_gpu) <= {GPU_BUSY["utilization_gpu"], GPU_STALLED["utilization_gpu"]}
    view = json.loads((run / "manifest.json").read_text())["extra"]["gpu_view"]["measure"]
    assert view["windows"] == 2  # the measured cycles: ocs_command_sent .. last port_active
    for host, s in view["hosts"].items():
        assert s["n_inside"] >= 1 and s["n_outside"] >= 1, (host, s)
        assert s["mean_util_outside"] == GPU_BUSY["utilization_gpu"]
    # Every sample against the emulator's port truth (load cannot move it: a loaded switch stretches the
    # windows, not the truth): a sample whose bound lies where one of its host's ports was not ACTIVE reads
    # idle, one whose bound lies where all were reads busy.
    truth = pd.read_parquet(run / "ground_truth.parquet")
    checked = {}
    for host, mine in samples.groupby("host"):
        events = truth[(truth.host == host) & truth.stage.isin(["port_down", "port_active"])].sort_values("t_ns")
        active = {port: g.stage.iloc[0] == "port_down" for port, g in events.groupby("port")}  # before the first
        edges = [(events.t_ns.iloc[0], all(active.values()))]
        for e in events.itertuples():
            active[e.port] = e.stage == "port_active"
            edges.append((e.t_ns, all(active.values())))
        kinds = []
        for smp in mine.itertuples():
            lo, hi = smp.t_ns - smp.uncertainty_ns, smp.t_ns + smp.uncertainty_ns
            if lo < edges[0][0] or hi > edges[-1][0]:
                continue  # outside the span the truth covers
            states = {busy for t, busy in edges if lo < t <= hi} | {next(b for t, b in reversed(edges) if t <= lo)}
            if len(states) == 1:
                busy = states.pop()
                assert smp.utilization_gpu == (GPU_BUSY if busy else GPU_STALLED)["utilization_gpu"], (host, smp)
                kinds.append(busy)
        checked[host] = (kinds.count(True), kinds.count(False))
    assert all(busy >= 1 and idle >= 1 for busy, idle in checked.values()), checked
    # in the run's report: summary.md and the HTML page, one row per host from the same manifest record
    rows = gpu_view.table_rows({"measure": view})
    assert [r[:3] for r in rows] == [["measure", h, "2"] for h in sorted(view["hosts"])]
    assert all(r[-1] == str(GPU_BUSY["utilization_gpu"]) for r in rows)
    summary_md = (run / "summary.md").read_text()
    assert "## GPUs while the network re-trains" in summary_md
    assert all("| " + " | ".join(r) + " |" in summary_md for r in rows)
    from harness.html_report import gpu_section, load_run

    page = gpu_section(load_run(run))
    assert page.startswith("<table>") and all(f"<td>{h}</td>" in page for h in view["hosts"])


def test_a_pod_is_sampled_on_a_bounded_spread_of_its_hosts():
    pod = [f"gpu{i}" for i in range(1, 257)]
    chosen = gpu_view.spread(pod, 16)
    assert chosen == [f"gpu{1 + round(i * 255 / 15)}" for i in range(16)]  # first to last, evenly spaced
    assert chosen[:3] == ["gpu1", "gpu18", "gpu35"] and chosen[-1] == "gpu256"
    assert gpu_view.spread(pod[:5], 16) == pod[:5]



class _ScriptedLoop:
    """What `nvidia-smi ... -lms N` printed, each line with the harness time it arrived; then its end."""

    command = "nvidia-smi"

    def __init__(self, lines, exit_status):
        self.lines, self.exit_status, self.stderr = lines, exit_status, ""

    def __iter__(self):
        yield from self.lines

    def close(self):
        pass


class _Session:  # a host clock 3 s ahead of the harness, known to ±0.2 ms; its connection gives out `streams`
    OFFSET, BOUND = 3_000_000_000, 200_000

    def __init__(self, streams):
        from types import SimpleNamespace

        def stream(command):
            assert command == gpu_view.query(gpu_view.INTERVAL_S)
            if not streams:
                raise TransportClosed("gpu1: connection refused")
            return streams.pop(0)

        self.transport = SimpleNamespace(stream=stream)

    def to_harness(self, host_ns):
        return host_ns - self.OFFSET, self.OFFSET, self.BOUND


def test_each_sample_is_bounded_by_its_host_stamp_and_arrival_and_a_dead_stream_is_a_fault(tmp_path):
    """A host in UTC+2 whose nvidia-smi dies, is started again, stops printing for 1.2 s and dies again (then
    its host refuses): each sample's bound holds the true query time (host stamp, ms, converted; arrival); the
    ends, the failed restart and the gap are the view's faults; a host without nvidia-smi (no line, exit 127)
    has none."""
    import time as _time
    from types import SimpleNamespace

    zone = 2 * 3600 * 10**9
    base = now_ns() // 10**9 * 10**9 + _Session.OFFSET + 400_000  # host times 0.4 ms past a millisecond
    truth, scripts = {}, []
    for ks in ((0, 1, 2), (3, 4, 10, 11)):  # nothing from 5 to 9: a 1.2 s hole
        lines = []
        for k in ks:
            host_ns = base + k * 200_000_000
            stamp = _time.strftime("%Y/%m/%d %H:%M:%S", _time.gmtime((host_ns + zone) // 10**9)) + \
                f".{host_ns % 10**9 // 10**6:03d}"
            arrival = host_ns - _Session.OFFSET + 3_000_000  # 3 ms later on the harness clock
            lines += [(arrival, f"{stamp}, {gpu}, 97, 1024, 412.50") for gpu in (0, 1)]
            truth[host_ns // 10**6 * 10**6] = host_ns - _Session.OFFSET
        scripts.append(_ScriptedLoop(lines, 255))
    printed = [line for script in scripts for _, line in script.lines]
    streams = {"gpu1": scripts, "gpu2": [_ScriptedLoop([], 127)]}
    said = []
    from harness.bench.observe import ObservationLog

    log = ObservationLog(tmp_path / "observations.jsonl")
    ctx = SimpleNamespace(inventory=SimpleNamespace(hosts={"gpu1": None, "gpu2": None}), say=said.append,
                          open_sessions=lambda hosts: {h: _Session(streams[h]) for h in hosts},
                          run_dir=tmp_path, manifest_extra={}, dry_run=False, bench=SimpleNamespace(observe=lambda: log))
    view = gpu_view.GpuView(ctx, "measure", ["gpu1", "gpu2"]).start()
    end = _time.monotonic() + 30
    while [len(f.ends) for f in view._feeds] != [3, 1]:  # gpu1: two ends and a refused restart; gpu2: one end
        assert _time.monotonic() < end, [f.ends for f in view._feeds]
        _time.sleep(0.01)
    view.window(base - _Session.OFFSET - 10**9, base - _Session.OFFSET + 10**9)
    summary = view.stop()
    samples = [json.loads(x) for x in (tmp_path / "gpu_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * len(truth) and {s["host"] for s in samples} == {"gpu1"}
    for s in samples:
        assert s["host_ns"] in truth  # the zone found: the host's own clock, to the millisecond
        assert s["t_ns"] - s["uncertainty_ns"] <= truth[s["host_ns"]] <= s["t_ns"] + s["uncertainty_ns"]
        assert s["uncertainty_ns"] <= (3_000_000 + _Session.BOUND + 400_000) // 2 + 1  # ms start .. arrival
    assert set(view.faults) == {"gpu1"}
    fault = view.faults["gpu1"]
    assert "stream ended 3 time(s)" in fault and "connection refused" in fault and "1 gap(s)" in fault, fault
    assert "no samples after the last" in fault
    assert summary["faults"] == view.faults and any("GPU view of gpu1" in line for line in said)
    assert any(fault in line for line in gpu_view.markdown({"measure": summary}))
    # the lines went through the run's one observation log: mirrored raw, as nvidia-smi printed them, and none
    # left on the queue a cycle's wait reads
    log.close()
    mirrored = [json.loads(x) for x in (tmp_path / "observations.jsonl").read_text().splitlines()]
    assert [(m["kind"], m["host"], m["value"]) for m in mirrored] == \
        [("gpu", "gpu1", line) for line in printed]
    assert log.get(0) is None
