"""Timestamp accuracy and harness overhead on the emulated bench (issue 3 acceptance).

Runs the turnaround playbook on an emulated bench whose hosts have non-zero clock offsets and drift, then
compares every recorded event with the emulator's ground truth:
- per stage: p50 / p99 of |recorded − true| and the fraction of events whose true time lies within
  ±uncertainty (goals: p99 ≤ 1 ms, p50 ≤ 0.2 ms, coverage ≥ 99 %), and the true stage events of the
  measured cycles, while each watched, that have no recorded event (lost: goal 0);
- the clock samples the harness kept (observations.jsonl): their delay, and their offset against the host's
  true offset then (`analysis.accuracy.clock_sample_errors`), what every conversion above stands on;
- harness overhead per cycle: the wall time of a cycle that is not physics (`total`):
  (next cycle's begin − this cycle's begin) − (the cycle's last ground-truth stage event − its command sent),
  in three parts: before_command (begin → command on the wire: drain, plan), after_last_event (last true
  event → the cycle's end: event delivery through agent, SSH, reader and expect()), between_cycles (cycle's
  end → next begin: clock check, conversion, durable write, bookkeeping). Wall times grow with the machine's
  load (other processes), so the harness's CPU per cycle is reported too (process CPU, every thread, and the
  CPU of the thread running the step, between consecutive cycle ends: `cpu_ns` in observations.jsonl).
  after_last_event is split where the cycle's last host line left the bench: the bench's side (agent poll,
  emulator, its SSH, until then) and the harness's side (that line -> cycle's end). By default that is when the
  emulator's socket send of the last byte of the line's SSH packet began (`--arrival wire`:
  devices.sshhub.record_wire in both processes, `harness emulate --wire-out`; the packet cannot have reached
  this machine before, so the harness's side also counts the few µs of loopback); `--arrival read` takes
  `recv_ns` itself, the hub's read of the line, which counts the hub's own backlog (the harness's) as the bench's.
  With wire arrivals, delivery_hub_backlog is the first part of the harness's side: the last line's wait, sent,
  for the hub to read it.
  harness_side = before_command + delivery_harness_side + between_cycles: the harness's own part of total,
  goal median ≤ 2 ms (the rest of total is the emulated bench's, sharing the machine's cores).
  With the emulator in its own process, its CPU per cycle too (`cpu_emulator`: every thread, sampled from
  /proc, the measured cycles' span divided by their number): both processes share the machine's cores, so
  a burst of work in one delays the other; and the emulator's own line on how late its schedule ran (`harness
  emulate` prints it at exit). The harness's CPU per cycle beside the step's thread, the same way, per thread
  (/proc/self/task/TID/schedstat): the SSH hub's (`cpu_hub_thread`: reads, decryption, line parsing for every
  host), the switches' reply threads', the clock thread's (its probes and fits), the others'. Their Python
  shares one GIL: a thread's CPU is its own work, not the time it waited for the others.

    .venv/bin/python benchmarks/timestamp_accuracy.py [--cycles 200] [--profile burst-mode] [--pod 8x8]

`--pod HOSTSxNICS`: the profile's delays over that many hosts and NICs per host, every NIC on one switch
(`benchmarks/scale.py`'s `write_profile`): the harness's own part at 8 hosts by 1, 2, 4, 8 NICs per host.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import orjson
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.accuracy import (KEY, OCS_TRUTH_STAGES, accuracy_table, assign_cycles, clock_sample_errors, match,  # noqa: E402
                               ocs_command_check, ocs_command_table, unrecorded, watched_truth)
from devices.ocs.registry import DEFAULT_PROTOCOL, protocol_names  # noqa: E402
from harness.events import STAGES  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.finish import ocs_command_line  # noqa: E402


def overhead_ms(cycles: pd.DataFrame, truth: pd.DataFrame) -> dict[str, np.ndarray]:
    """Total overhead per cycle and its parts: before the command (read state, plan), after the last
    physical event until the cycle is complete (event transport), and between cycles (log, clock)."""
    last_true = truth.groupby("cycle")["t_ns"].max()
    c = cycles.sort_values("cycle").set_index("cycle")
    wall = c["begin_ns"].shift(-1) - c["begin_ns"]
    physical = last_true.reindex(c.index) - c["sent_ns"]
    parts = {"total": wall - physical, "before_command": c["sent_ns"] - c["begin_ns"],
             "after_last_event": c["done_ns"] - last_true.reindex(c.index),
             "between_cycles": c["begin_ns"].shift(-1) - c["done_ns"]}
    return {k: (v.dropna() / 1e6).to_numpy() for k, v in parts.items()}


def observation_records(run_dir: Path) -> dict[str, list[dict]]:
    """observations.jsonl's records by kind ("obs", "cycle", "clock"), read once."""
    records: dict[str, list[dict]] = {}
    for line in (run_dir / "observations.jsonl").read_bytes().splitlines():
        record = orjson.loads(line)
        records.setdefault(record["k"], []).append(record)
    return records


def cpu_ms(cycle_records: list[dict]) -> dict[str, np.ndarray]:
    """Harness CPU per cycle (ms) from observations.jsonl's cycle records: all threads, and the step's thread."""
    rows = [r for r in cycle_records if "cpu_ns" in r]
    return {"process": np.diff([r["cpu_ns"] for r in rows]) / 1e6,
            "step_thread": np.diff([r["step_cpu_ns"] for r in rows]) / 1e6}


def _playbook(out: Path, cycles: int, bench: str, watch_us: int, step: dict) -> Path:
    playbook = out / "accuracy.yaml"
    playbook.write_text(json.dumps({
        "name": "accuracy", "bench": bench, "seed": 11, "cycles": cycles,
        "steps": [{"type": "turnaround", "name": "measure", "watch_interval_us": watch_us,
                   "ethtool_interval_us": watch_us, "probe_interval_us": 100, "cycle_timeout_s": 30, **step}]}))
    return playbook


def run_in_process(cycles: int, profile: str, watch_us: int, out: Path,
                   step: dict) -> tuple[Path, pd.DataFrame, dict]:
    """The emulator inside the harness process (what `--bench emulated:PROFILE` does)."""
    code = main(["run", str(_playbook(out, cycles, f"emulated:{profile}?ocs={PROTOCOL}", watch_us, step)), "--out", str(out / "runs" / "run"),
                 "-q"])
    if code != 0:
        raise SystemExit(f"run failed with exit code {code}")
    run_dir = next((out / "runs").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    OCS_COMMAND.update(json.loads((run_dir / "summary.json").read_text())["summary"].get("ocs_command") or {})
    return run_dir, pd.read_parquet(run_dir / "ground_truth.parquet"), manifest["emulated_clocks"]


def process_cpu(pid: int):
    """`CpuSampler`'s reader of another process: {"all": its CPU ns, every thread and live child}
    (`benchmarks/scale.py`'s `live_cpu_s`); None once it has ended."""
    from scale import live_cpu_s

    def read() -> dict | None:
        cpu = live_cpu_s(pid)
        return None if cpu is None else {"all": int(cpu * 1e9)}
    return read


def harness_threads_cpu() -> dict:
    """`CpuSampler`'s reader of this process's threads but the samplers': {(name, native id): CPU ns} from
    /proc/self/task/TID/schedstat (what `time.thread_time_ns` reads, in the thread). A thread gone since keeps
    the CPU last read of it (`CpuSampler.per_cycle_ms`)."""
    cpu = {}
    for thread in threading.enumerate():
        if thread.native_id is None or thread.name == SAMPLER_THREAD:
            continue
        try:
            cpu[(thread.name, thread.native_id)] = int(
                Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # ended meanwhile, or no schedstat on this kernel
            pass
    return cpu


THREAD_PARTS = ("hub_thread", "reply_threads", "clock_thread", "other_threads")  # `thread_part`'s, as printed


def thread_part(key: tuple[str, int]) -> str | None:
    """A harness thread's part: the SSH hub's, the clock thread's, the switches' reply threads', or the rest;
    None for the step's (the main thread's: `cpu_step_thread`, per cycle, from the run's own records)."""
    name = key[0]
    if name == "MainThread":
        return None
    if name.startswith("ssh-hub"):
        return "hub_thread"
    if name == "clock-sync":
        return "clock_thread"
    return "reply_threads" if name.startswith("ocs-replies") else "other_threads"


SAMPLER_THREAD = "cpu-sampler"


class CpuSampler:
    """(monotonic ns, `read()`: {key: CPU ns}) every `period_s`, until `read` returns None or `stop`."""

    def __init__(self, read: Callable[[], dict | None], period_s: float = 0.02):
        self.read, self.period_s, self.samples = read, period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=SAMPLER_THREAD)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            cpu = self.read()
            if cpu is None:
                return
            self.samples.append((time.monotonic_ns(), cpu))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def per_cycle_ms(self, cycles: pd.DataFrame, part: Callable = lambda key: key) -> dict[str, np.ndarray]:
        """CPU over the measured cycles (first begin -> last done) / their number, in ms (one value), per
        `part(key)` (None: left out): a key's CPU is 0 before its first sample and its last after its last."""
        if len(self.samples) < 2 or cycles.empty:
            return {}
        t = np.array([at for at, _ in self.samples], dtype=np.float64)
        ends = [cycles["begin_ns"].min(), cycles["done_ns"].max()]
        total: dict[str, float] = {}
        for key in set().union(*(cpu for _, cpu in self.samples)):
            if (name := part(key)) is None:
                continue
            values = pd.Series([cpu.get(key) for _, cpu in self.samples], dtype="float64").ffill().fillna(0)
            span = np.interp(ends, t, values.to_numpy())
            total[name] = total.get(name, 0.0) + span[1] - span[0]
        return {name: np.array([cpu / len(cycles) / 1e6]) for name, cpu in total.items()}


def run_separate_process(cycles: int, profile: str, watch_us: int, out: Path,
                         step: dict) -> tuple[Path, pd.DataFrame, dict]:
    """`harness emulate` in its own process and the harness driving its inventory, as on a real bench:
    the overhead measured is then the harness's own, not the emulator's sharing its interpreter."""
    inventory, truth_file, wire_file = out / "bench.yaml", out / "truth.jsonl", out / "wire.json"
    emulator_out = (out / "emulator.out").open("w")
    emulator = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--profile", profile, "--seed", "11",
                                 "--protocol", PROTOCOL,
                                 "--inventory-out", str(inventory), "--truth-out", str(truth_file)]
                                + (["--wire-out", str(wire_file)] if WIRE is not None else []),
                                stdout=emulator_out, stderr=subprocess.PIPE)
    sampler = CpuSampler(process_cpu(emulator.pid))
    threads = CpuSampler(harness_threads_cpu, period_s=0.1)  # only the measured span's ends matter
    try:
        end = time.monotonic() + 60
        while not inventory.exists():
            if emulator.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"emulator did not start: {emulator.stderr.read().decode()[-500:]}")
            time.sleep(0.05)
        os.environ.setdefault("OCS_HIL_EMULATED_PASSWORD", "root")
        os.environ.setdefault("OCS_HIL_LOCK_DIR", str(out / "locks"))
        code = main(["run", str(_playbook(out, cycles, str(inventory), watch_us, step)), "--out", str(out / "runs" / "run"), "-q"])
        if code != 0:
            raise SystemExit(f"run failed with exit code {code}")
    finally:
        sampler.stop()
        threads.stop()
        emulator.send_signal(signal.SIGINT)
        emulator.wait(timeout=30)
        emulator_out.close()
    run_dir = next((out / "runs").iterdir())
    EMULATOR_SCHEDULE.extend(line for line in (out / "emulator.out").read_text().splitlines()
                             if line.startswith("emulator schedule:"))
    global EMULATOR_CPU, HARNESS_THREADS_CPU
    EMULATOR_CPU, HARNESS_THREADS_CPU = sampler, threads
    if WIRE is not None:
        EMULATOR_WIRE.extend(json.loads(wire_file.read_text()))
    rows = [json.loads(line) for line in truth_file.read_text().splitlines()]
    clocks = {r["host"]: r for r in rows if r["stage"] == "host_clock"}
    truth = pd.DataFrame([r for r in rows if r["stage"] in STAGES])
    cycles_df = pd.read_parquet(run_dir / "cycles.parquet")
    starts = list(zip(cycles_df["cycle"], cycles_df["begin_ns"]))
    truth = assign_cycles(truth, starts)
    switch = assign_cycles(pd.DataFrame([r for r in rows if r["stage"] in OCS_TRUTH_STAGES]), starts)
    events = pd.read_parquet(run_dir / "events.parquet")
    OCS_COMMAND.update(ocs_command_table(ocs_command_check(events[events["cycle"] > 0], switch)))
    return run_dir, truth, clocks


PROTOCOL = DEFAULT_PROTOCOL  # `--protocol`: the emulated switch's, as the harness drives it
WIRE: dict | None = None  # this process's devices.sshhub.record_wire, with `--arrival wire`
EMULATOR_WIRE: list[dict] = []  # the separate emulator's (`harness emulate --wire-out`)


def _sends_by_connection() -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """(local port, peer port) -> (when each send began, where its bytes end), of every socket that sent: the
    emulator's, and in-process this one's."""
    sends = {(r["local"], r["peer"]): r["sent"] for r in EMULATOR_WIRE}
    sends.update({key: r["sent"] for key, r in (WIRE or {}).items() if r["sent"]})
    return {key: (np.array([t for t, _ in v], dtype=np.int64), np.array([e for _, e in v], dtype=np.int64))
            for key, v in sends.items() if v}


def arrivals_ns(obs_records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """When each host line left the bench, sorted: with `--arrival wire`, when the peer's send of the last byte of
    its SSH packet began (the packet is fed where it ends in the stream; the first send whose bytes reach there
    carried it), else its `recv_ns` (the harness's read of it); and each one's `recv_ns`, in the same order."""
    left = {}
    if WIRE is not None:
        sends = _sends_by_connection()
        later = 0
        for (local, peer), record in WIRE.items():
            if not record["fed"] or (peer, local) not in sends:
                continue
            began, ends = sends[(peer, local)]
            stamps, fed_ends = np.array(record["fed"], dtype=np.int64).T
            at = np.searchsorted(ends, fed_ends)  # the first send whose bytes reach the packet's end
            ok = at < len(ends)
            sent = began[np.minimum(at, len(ends) - 1)]
            later += int(np.sum(ok & (sent > stamps)))
            left.update(zip(stamps[ok].tolist(), sent[ok].tolist()))
        if later:  # a packet fed before its bytes were sent: the accounting, not the harness, is wrong
            raise SystemExit(f"{later} SSH packets were fed before their send began: the wire lists do not match")
    WIRE_MATCHED[:] = [sum(r["recv_ns"] in left for r in obs_records), len(obs_records)]
    reads = np.array([r["recv_ns"] for r in obs_records], dtype=np.int64)
    arrived = np.array([left.get(r, r) for r in reads.tolist()], dtype=np.int64)
    order = np.argsort(arrived, kind="stable")
    return arrived[order], reads[order]


WIRE_MATCHED = [0, 0]  # host lines matched to the send that carried them, of all (the rest: their read)


def delivery_split_ms(recv: np.ndarray, reads: np.ndarray, cycles: pd.DataFrame,
                      truth: pd.DataFrame) -> dict[str, np.ndarray]:
    """after_last_event in two: the bench's side (last true event -> the cycle's last host line leaves the bench:
    agent poll, emulator, its SSH) and the harness's side (that line -> the cycle's end); with wire arrivals,
    the harness's side's first part too: that line's wait for the SSH hub to read it (its `recv_ns` - its
    send: loopback and the hub's backlog). `recv`, `reads`: `arrivals_ns`."""
    last_true = truth.groupby("cycle")["t_ns"].max()
    bench, harness, hub = [], [], []
    for row in cycles.itertuples():
        inside = np.nonzero((recv >= row.sent_ns) & (recv <= row.done_ns))[0]
        if inside.size and row.cycle in last_true.index:
            last = inside[-1]
            bench.append(recv[last] - last_true[row.cycle])
            harness.append(row.done_ns - recv[last])
            hub.append(reads[last] - recv[last])
    parts = {"delivery_bench_side": np.array(bench) / 1e6, "delivery_harness_side": np.array(harness) / 1e6}
    if WIRE is not None:
        parts["delivery_hub_backlog"] = np.array(hub) / 1e6
    return parts


OCS_COMMAND: dict = {}  # the last run's analysis.accuracy.ocs_command_table: recorded sends against the switch
EMULATOR_CPU: CpuSampler | None = None  # the separate emulator's, when the last run had one
HARNESS_THREADS_CPU: CpuSampler | None = None  # this process's threads', when the last run had its own emulator
EMULATOR_SCHEDULE: list[str] = []  # the separate emulator's own line on its schedule's lateness, at its exit


def harness_side_ms(recv: np.ndarray, cycles: pd.DataFrame) -> np.ndarray:
    """Per cycle, the harness's own part of `total`: before_command + (the cycle's last host line ->
    its end) + between_cycles. `recv`: the lines' arrivals, sorted (`arrivals_ns`)."""
    c = cycles.sort_values("cycle").reset_index(drop=True)
    out = []
    for i, row in enumerate(c.itertuples()):
        window = recv[(recv >= row.sent_ns) & (recv <= row.done_ns)]
        if window.size and i + 1 < len(c):
            out.append((row.sent_ns - row.begin_ns) + (row.done_ns - window[-1]) + (c["begin_ns"][i + 1] - row.done_ns))
    return np.array(out) / 1e6


def report(run_dir: Path, truth: pd.DataFrame, clocks: dict) -> dict:
    events = pd.read_parquet(run_dir / "events.parquet")
    cycles = pd.read_parquet(run_dir / "cycles.parquet")
    table = accuracy_table(match(events[events["cycle"] > 0], truth))
    # every measured cycle, while it watched: its true stage events without a recorded one
    measured = cycles[cycles["cycle"] > 0].set_index("cycle")["done_ns"].to_dict()
    lost = unrecorded(events[events["cycle"] > 0], watched_truth(truth, measured))
    lost = [tuple(k) for k in lost[KEY].itertuples(index=False)]
    offsets = {h: round(c["offset_ns"] / 1e6, 3) for h, c in clocks.items()}
    drifts = {h: round(c["drift_ppm"], 2) for h, c in clocks.items()}
    ports = events[events["stage"] == "phy_up"].groupby(["host", "port"]).ngroups
    parts = overhead_ms(cycles, truth)
    records = observation_records(run_dir)
    arrived, reads = arrivals_ns(records.get("obs", []))
    parts.update(delivery_split_ms(arrived, reads, cycles, truth))
    parts["harness_side"] = harness_side_ms(arrived, cycles)
    parts.update({f"cpu_{k}": v for k, v in cpu_ms(records.get("cycle", [])).items()})
    measured_cycles = cycles[cycles["cycle"] > 0]
    if EMULATOR_CPU is not None and "all" in (emulator := EMULATOR_CPU.per_cycle_ms(measured_cycles)):
        parts["cpu_emulator"] = emulator["all"]
    if HARNESS_THREADS_CPU is not None:
        threads = HARNESS_THREADS_CPU.per_cycle_ms(measured_cycles, thread_part)
        parts.update({f"cpu_{k}": threads[k] for k in THREAD_PARTS if k in threads})
    samples = clock_sample_errors(pd.DataFrame(records.get("clock", []), columns=[
        "host", "t_ns", "offset_ns", "delay_ns", "uncertainty_ns"]), clocks)
    return {"cycles": int(cycles["cycle"].nunique()), "ports": int(ports), "lost": lost,
            "faulted": cycles.loc[cycles["status"] != "ok", "cycle"].tolist(), "host_offsets_ms": offsets,
            "host_drift_ppm": drifts, "accuracy": table, "clock_samples": samples,
            "overhead_ms": {k: {"p50": float(np.median(v)), "p90": float(np.quantile(v, 0.9)),
                                "p99": float(np.quantile(v, 0.99)), "n": int(v.size)} for k, v in parts.items()
                            if v.size}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--profile", default="burst-mode")
    ap.add_argument("--pod", metavar="HOSTSxNICS", default=None,
                    help="the profile's delays over this topology, every NIC on one switch (e.g. 8x8)")
    ap.add_argument("--watch-us", type=int, default=200, help="agent poll interval (sysfs and ethtool -m)")
    ap.add_argument("--emulator", choices=("process", "in-process"), default="process",
                    help="`harness emulate` in its own process (default, as on a bench) or inside the harness")
    ap.add_argument("--protocol", default=DEFAULT_PROTOCOL, choices=protocol_names(),
                    help="the emulated OCS's protocol the harness drives (its driver's begin_apply/finish)")
    ap.add_argument("--arrival", choices=("wire", "read"), default="wire",
                    help="where a host line's delivery stops being the bench's: the emulator's send of its SSH "
                         "packet (default) or the harness's read of it")
    ap.add_argument("--late-report-ms", type=float, default=None,
                    help="the step's grace for late polled reports once a port's last stage is in (default: the "
                         "step's); it is a wait the playbook chooses, counted in after_last_event")
    args = ap.parse_args()
    PROTOCOL = args.protocol
    step = {} if args.late_report_ms is None else {"late_report_ms": args.late_report_ms}
    runner = run_separate_process if args.emulator == "process" else run_in_process
    if args.arrival == "wire":
        from devices.sshhub import record_wire

        WIRE = record_wire()  # this process's hub sockets, opened by the run (in-process: the emulator's too)
    with tempfile.TemporaryDirectory() as tmp:
        profile = args.profile
        if args.pod:
            from scale import write_profile

            hosts, _, nics = args.pod.partition("x")
            (Path(tmp) / "pod").mkdir()
            profile = str(write_profile(Path(tmp) / "pod", int(hosts), int(nics), args.profile))
        r = report(*runner(args.cycles, profile, args.watch_us, Path(tmp), step))
    print(f"{r['cycles']} cycles x {r['ports']} ports, profile {args.profile}"
          f"{f' as a {args.pod} pod' if args.pod else ''}, poll {args.watch_us} µs, "
          f"emulator {args.emulator}, OCS {args.protocol}, late_report_ms {step.get('late_report_ms', 'default')}, "
          f"line arrival: {args.arrival}" + (f" ({WIRE_MATCHED[0]} of {WIRE_MATCHED[1]} lines matched to their send)"
                                              if args.arrival == "wire" else ""))
    print(f"host clock offsets (ms): {r['host_offsets_ms']}  drift (ppm): {r['host_drift_ppm']}")
    print(r["accuracy"].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"true stage events without a recorded one (lost): {len(r['lost'])}"
          f"{' ' + str(r['lost'][:6]) if r['lost'] else ''}; cycles not ok: {r['faulted'] or 'none'}")
    cs = r["clock_samples"]
    if len(cs):  # what every conversion stands on: the kept clock samples against the hosts' true offsets
        err, delay = cs["error_ns"].abs() / 1e6, cs["delay_ns"] / 1e6
        print(f"clock samples kept: {len(cs)}, delay p50 {delay.median():.3f} ms, p90 {delay.quantile(0.9):.3f} ms; "
              f"|offset error| p50 {err.median():.4f} ms, p99 {err.quantile(0.99):.4f} ms, median error "
              f"{cs['error_ns'].median() / 1e6:+.4f} ms, within ± uncertainty {cs['covered'].mean():.1%} "
              "(the tracker weighs each by 1/uncertainty²)")
    if OCS_COMMAND:
        print(ocs_command_line(OCS_COMMAND))
    print(*EMULATOR_SCHEDULE, sep="\n")
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}")
    for part, o in r["overhead_ms"].items():
        print(f"harness overhead per cycle, {part:>16}: p50 {o['p50']:.2f} ms, p90 {o['p90']:.2f} ms, "
              f"p99 {o['p99']:.2f} ms (n={o['n']})")
    # The overhead goal is the harness's own part: `total` also holds the emulated bench's delivery, whose
    # agents and SSH servers share this machine's cores with the harness (on a bench they run on the hosts).
    own = r["overhead_ms"]["harness_side"]
    a = r["accuracy"].set_index("stage").loc["all"]
    ok = a["abs_err_p99_ms"] <= 1.0 and a["abs_err_p50_ms"] <= 0.2 and a["coverage"] >= 0.99 and own["p50"] <= 2.0 \
        and not r["lost"]
    print("goals (p99 ≤ 1 ms, p50 ≤ 0.2 ms, coverage ≥ 99 %, 0 lost, the harness's own overhead (harness_side) p50 "
          "≤ 2 ms):",
          "met" if ok else "NOT met")
