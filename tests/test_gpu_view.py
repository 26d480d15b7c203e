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
    import numpy as np

    with np.load(run / gpu_view.WINDOWS_FILE) as saved:  # beside the samples, not in the manifest
        assert saved.files == ["measure"]
        windows = saved["measure"]
    assert windows.shape == (2, 2) and (windows[:, 0] < windows[:, 1]).all()
    assert gpu_view.run_windows(run, {"measure": view}).tolist() == windows.tolist()
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

    def to_harness_many(self, host_ns):
        import numpy as np

        return host_ns - self.OFFSET, np.full_like(host_ns, self.OFFSET), np.full_like(host_ns, self.BOUND)


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


def _tracker(t0: int, offset: int):
    """A host clock model with a step and more samples than a fit's window (kept and compacted fits)."""
    from harness.clock import ClockSample, ClockTracker

    tracker = ClockTracker("gpu1", window=16)
    for k in range(80):
        t = t0 + k * 100_000_000
        jump = 5_000_000 if k >= 50 else 0  # the host's clock stepped 5 ms
        unc = 30_000 + (k * 7919) % 90_000
        tracker.add(ClockSample(t_ns=t, offset_ns=offset + jump + k * 1_000 + unc // 3, delay_ns=2 * unc,
                                uncertainty_ns=unc))
    return tracker


class _Clocked:
    def __init__(self, tracker):
        self.clock = tracker

    def to_harness(self, host_ns):
        return self.clock.to_harness(host_ns)

    def to_harness_many(self, host_ns):
        return self.clock.to_harness_many(host_ns)


def _stamp(local_ns: int) -> str:
    import time as _time

    return _time.strftime("%Y/%m/%d %H:%M:%S", _time.gmtime(local_ns // 10**9)) + f".{local_ns % 10**9 // 10**6:03d}"


def _view_of(tmp_path, feeds: dict, windows):
    """A GpuView at its step's end whose hosts printed `feeds` (host -> (session, [(recv_ns, line)]))."""
    from types import SimpleNamespace

    said = []
    ctx = SimpleNamespace(inventory=SimpleNamespace(hosts=dict.fromkeys(feeds)), say=said.append,
                          run_dir=tmp_path, manifest_extra={}, dry_run=False)
    view = gpu_view.GpuView(ctx, "measure", list(feeds))
    for host, (session, lines) in feeds.items():
        feed = gpu_view._Feed(host, session)
        feed.lines.write(b"".join(b"%d " % recv + line.encode("utf-8", "surrogateescape") + b"\n"
                                  for recv, line in lines))
        view._feeds.append(feed)
    view.started_ns = min(recv for _, lines in feeds.values() for recv, _ in lines)
    for w in windows:
        view.window(*w)
    return view, said


def _lines(t0: int, offset: int, zone: int, queries: int, odd: dict):
    """`queries` of 4 GPUs each, 50 ms apart (one hole of 1 s), arriving 3 ms after; `odd`: query number -> lines
    to print in its place."""
    lines = []
    for q in range(queries):
        t = t0 + q * 50_000_000 + (1_000_000_000 if q > queries // 2 else 0)
        host_ns = t + offset + 400_000
        if q in odd:
            lines += [(t + 3_000_000, line.replace("STAMP", _stamp(host_ns + zone))) for line in odd[q]]
            continue
        busy = (q // 7) % 2
        lines += [(t + 3_000_000, f"{_stamp(host_ns + zone)}, {gpu}, {97 if busy else 0}, {1024 + gpu}, "
                                  f"{'612.40' if busy else '118.3'}") for gpu in range(4)]
    return lines


def test_the_bulk_conversion_equals_the_one_line_reference(tmp_path, monkeypatch):
    """Lines of every shape (XID events, blank, [N/A] values, quoted and spaced cells, non-ASCII, an impossible
    month), hosts in other zones, windows overlapping and samples straddling their edges, chunks cut anywhere:
    the bulk path writes the same samples file, counts and faults as the one-line reference, and took the
    chunks itself."""
    t0, offset = 10**12, 1_765_000_000 * 10**9
    odd = {0: ["Xid 79: GPU has fallen off the bus", "   "],
           3: ["STAMP, 0, [N/A], 1024, [N/A]", "STAMP, 1, 97, [Not Supported], 612.40"],
           5: ['STAMP, "2", 97, 1024, 612.40', "STAMP,   3 , 97, 1024 , 612.40 "],
           8: ["STAMP, 0, 97, 1024, 612.40, extra", "STAMP, 1, 97, 1024 MiB, 612.4 W",
               "2026/13/01 00:00:00.000, 0, 1, 2, 3"],
           9: ["STAMP, 0, 97, 1024, 612.40 \u00b5", "STAMP, 1, 0, 0, \udcff"],
           11: ["STAMP, 0, 4, 7, 0.0001", "STAMP, 1, 5, 7, 12345678901234567890.5", "STAMP, 2, 6, 7, -1", ""]}
    feeds = {"gpu1": (_Clocked(_tracker(t0 - 10**9, offset)), _lines(t0, offset, 19_800 * 10**9, 90, odd)),
             "gpu2": (_Clocked(_tracker(t0 - 10**9, offset + 7)), _lines(t0, offset + 7, -3 * 3600 * 10**9, 60, {})),
             "gpu3": (_Clocked(_tracker(t0 - 10**9, offset)), [(t0, "nvidia-smi: command not found")])}
    edges = [t0 + k * 50_000_000 + 1_000_000 for k in range(0, 200, 3)]  # a sample is bounded by [~0.4, 3] ms
    windows = [(b, b + 80_000_000) for b in edges[::2]] + [(edges[5], edges[9]), (edges[20], edges[21])]
    # and windows on samples' own bounds (from a first conversion, without windows): an edge equal to a bound's
    view, _ = _view_of(tmp_path, feeds, [(0, 0)])
    view.stop()
    bounds = [(r["t_ns"] - r["uncertainty_ns"], r["t_ns"] + r["uncertainty_ns"])
              for r in map(json.loads, (tmp_path / "gpu_samples.jsonl").read_text().splitlines())][-80::4]
    windows += [(lo, hi) for lo, hi in bounds[0::4]] + [(hi, hi + 10**6) for _, hi in bounds[1::4]] + \
        [(lo - 10**6, lo) for lo, _ in bounds[2::4]]
    results, took = [], []
    real_bulk = gpu_view._Host.bulk
    for chunk, bulk in ((1 << 21, True), (333, True), (1 << 21, False)):
        monkeypatch.setattr(gpu_view, "CHUNK_BYTES", chunk)

        def counted(host, data, _bulk=bulk):
            took.append(real_bulk(host, data) if _bulk else None)
            return took[-1]

        monkeypatch.setattr(gpu_view._Host, "bulk", counted)
        run = tmp_path / f"{chunk}-{bulk}"
        run.mkdir()
        view, said = _view_of(run, feeds, windows)
        summary = view.stop()
        results.append(((run / "gpu_samples.jsonl").read_bytes(), summary, said))
        assert bulk is False or all(x is not None for x in took), "a chunk left to the one-line path"
        took.clear()
    assert results[0] == results[2] and results[1] == results[2]
    samples, summary, said = results[2]
    # what the reference itself says of these lines (so the comparison covers every case above)
    assert summary["hosts"]["gpu1"]["n_inside"] and summary["hosts"]["gpu1"]["n_outside"]
    assert summary["samples"] == len(samples.splitlines())
    rows = [json.loads(x) for x in samples.splitlines()]
    assert {r["host"] for r in rows} == {"gpu1", "gpu2"}
    assert any(r["utilization_gpu"] is None for r in rows) and any(r["power_w"] is None for r in rows)
    assert not any(r["memory_used_mib"] == "1024 MiB" for r in rows)  # a lone unit word goes
    assert any(isinstance(r["power_w"], float) and r["power_w"] > 1e18 for r in rows)
    straddling = 0
    for r in rows:
        lo, hi = r["t_ns"] - r["uncertainty_ns"], r["t_ns"] + r["uncertainty_ns"]
        straddling += any(lo < e <= hi for w in windows for e in w)
    assert straddling, "no sample crosses a window edge"
    fault = summary["faults"]["gpu1"]
    assert "3 line(s) not a sample, the first: 'Xid 79: GPU has fallen off the bus'" in fault and "gap(s)" in fault
    assert summary["faults"]["gpu3"] == "1 line(s) not a sample, the first: 'nvidia-smi: command not found'"
    assert "gpu3" not in summary["hosts"]


def test_a_float_utilisation_leaves_its_chunk_to_the_one_line_path(tmp_path, monkeypatch):
    """A utilisation that is not an integer sums in the reference's order: its chunk goes one line at a time,
    the result still the reference's."""
    t0, offset = 10**12, 1_765_000_000 * 10**9
    lines = _lines(t0, offset, 0, 40, {4: ["STAMP, 0, 50.5, 1024, 612.40"]})
    feeds = {"gpu1": (_Clocked(_tracker(t0 - 10**9, offset)), lines)}
    windows = [(t0 + k * 200_000_000, t0 + k * 200_000_000 + 100_000_000) for k in range(20)]
    out = []
    for bulk in (True, False):
        if not bulk:
            monkeypatch.setattr(gpu_view._Host, "bulk", lambda host, data: None)
        run = tmp_path / str(bulk)
        run.mkdir()
        view, said = _view_of(run, feeds, windows)
        out.append(((run / "gpu_samples.jsonl").read_bytes() if view.stop() is not None else b"", view.faults,
                    view.ctx.manifest_extra))
    assert out[0] == out[1]
    assert any(isinstance(v["mean_util_inside"], float) for v in out[0][2]["gpu_view"]["measure"]["hosts"].values())


def test_timestamps_in_bulk_read_as_the_parser_reads_them():
    import numpy as np

    from devices.parsers.gpu import parse_nvidia_timestamp

    rng = np.random.default_rng(5)
    parts = [rng.integers(1970, 2100, 500), rng.integers(1, 13, 500)] + [rng.integers(0, 100, 500) for _ in range(4)] \
        + [rng.integers(0, 1000, 500)]
    parts = [np.concatenate([p, q]) for p, q in zip(parts, ([1970, 2000, 2024, 2099], [1, 2, 2, 12], [1, 29, 29, 31],
                                                           [0, 23, 0, 99], [0, 59, 0, 99], [0, 59, 0, 99],
                                                           [0, 999, 0, 999]))]
    texts = [f"{y:04d}/{m:02d}/{d:02d} {h:02d}:{mi:02d}:{s:02d}.{ms:03d}" for y, m, d, h, mi, s, ms in zip(*parts)]
    assert gpu_view._utc_ns(*parts).tolist() == [parse_nvidia_timestamp(t) for t in texts]


def test_the_windows_file_keeps_each_steps_windows_and_an_older_run_reads_the_manifests(tmp_path):
    import numpy as np

    gpu_view._save_windows(tmp_path, "a", np.array([[1, 5], [7, 9]]))
    gpu_view._save_windows(tmp_path, "file", np.array([[2, 3]]))  # (any step name)
    gpu_view._save_windows(tmp_path, "a", np.array([[4, 6]]))  # the step again (resumed): its rows replaced
    assert sorted(gpu_view.run_windows(tmp_path, {}).tolist()) == [[2, 3], [4, 6]]
    with np.load(tmp_path / gpu_view.WINDOWS_FILE) as saved:
        assert sorted(saved.files) == ["a", "file"] and saved["file"].dtype == np.int64
    older = tmp_path / "older"
    older.mkdir()
    view = {"a": {"windows_ns": [[1, 5], [7, 9]]}, "b": {"windows_ns": [[2, 3]]}}
    assert gpu_view.run_windows(older, view).tolist() == [[1, 5], [7, 9], [2, 3]]
    assert gpu_view.run_windows(older, {"a": {}}).shape == (0, 2)
