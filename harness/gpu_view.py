"""The GPUs' side of a reconfiguration: `nvidia-smi` utilisation sampled on the hosts that have GPUs while a
step reconfigures the network, so a run shows what the GPUs did while the links re-trained.

SAMPLERS threads share the hosts sampled (at most MAX_HOSTS, spread over the step's hosts: a pod's threads and
tool load stay bounded, and the harness's threads do not grow with its hosts); each polls its hosts in turn with
`nvidia-smi --query-gpu=...` over the run's SSH connection; each sample is stamped
on the harness clock at the middle of its round trip, with half the round trip as its bound. At the end of
the step the samples go to `gpu_samples.jsonl` (fsynced) and the manifest gets, per host, the utilisation
inside the re-training windows (a cycle's `ocs_command_sent` to its last `port_active`, or the windows a step
marks) against between them (the steady state); a sample whose bound straddles a window edge is counted in
neither.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.parsers.gpu import parse_nvidia_smi_csv
from devices.timing import Deadline, now_ns

FIELDS = ("index", "utilization.gpu", "memory.used", "power.draw")
QUERY = f"nvidia-smi --query-gpu={','.join(FIELDS)} --format=csv,noheader,nounits"
IDLE_PERCENT = 5  # at or below: the GPU is idle
INTERVAL_S = 0.2  # between two samples of one host (nvidia-smi itself takes tens of ms on a real host)
MAX_HOSTS = 16  # hosts sampled per step: a pod's GPUs are shown by a spread of its hosts (bounded threads, load)
SAMPLERS = 4  # threads sharing them


def spread(hosts: list[str], at_most: int = MAX_HOSTS) -> list[str]:
    """`at_most` of the hosts (in the order given), evenly spaced from the first to the last (all when fewer)."""
    if len(hosts) <= at_most:
        return hosts
    step = (len(hosts) - 1) / (at_most - 1)
    return [hosts[round(i * step)] for i in range(at_most)]


class GpuView:
    def __init__(self, ctx, step_name: str, hosts, interval_s: float | None = None):
        self.ctx, self.step_name = ctx, step_name
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        order = {h: i for i, h in enumerate(ctx.bench.hosts)}
        hosts = sorted(set(hosts), key=lambda h: (order.get(h, len(order)), h))  # the inventory's order
        self.hosts_total = len(hosts)
        self.hosts = spread(hosts)
        self.samples: list[dict] = []
        self.windows: list[tuple[int, int]] = []  # (begin_ns, end_ns) marked by the step
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.started_ns = self.stopped_ns = 0

    def _sample(self, host: str, transport) -> bool:
        t0 = now_ns()
        try:
            result = transport.run(QUERY, deadline=Deadline(5.0))
        except (DeviceError, OSError):
            return False  # unreachable or dropped: the view is evidence, never a reason to hold the run up
        t1 = now_ns()
        if result.exit_status != 0:
            return False  # no GPUs (no nvidia-smi) on this host
        try:
            rows = parse_nvidia_smi_csv(result.stdout, list(FIELDS), header=False).records()
        except ParseError:
            return False
        with self._lock:
            self.samples += [{"step": self.step_name, "host": host, "gpu": row["index"], "t_ns": (t0 + t1) // 2,
                              "uncertainty_ns": (t1 - t0 + 1) // 2, "utilization_gpu": row["utilization.gpu"],
                              "memory_used_mib": row["memory.used"], "power_w": row["power.draw"]} for row in rows]
        return True

    def _poll(self, share: list[tuple[str, object]]) -> None:
        """Sample each host of `share` in turn, then wait the interval; a host without GPUs (or gone) drops out."""
        while share and not self._stop.is_set():
            share = [(h, t) for h, t in share if self._stop.is_set() or self._sample(h, t)]
            self._stop.wait(self.interval_s)

    def start(self) -> "GpuView":
        # The run's own connection per host (a channel per sample, as every command): the clock's min-delay
        # filter keeps its bound honest if a probe waits behind a sample; a host costs one SSH login per run.
        transports = {h: self.ctx.transport(h) for h in self.hosts}
        self.started_ns = now_ns()
        for k in range(min(SAMPLERS, len(self.hosts))):
            share = [(h, transports[h]) for h in self.hosts[k::SAMPLERS]]
            thread = threading.Thread(target=self._poll, args=(share,), daemon=True, name=f"gpu-view-{k}")
            thread.start()
            self._threads.append(thread)
        return self

    def window(self, begin_ns: int, end_ns: int) -> None:
        self.windows.append((begin_ns, end_ns))

    def _event_windows(self) -> list[tuple[int, int]]:
        events = self.ctx.log.events()
        events = events[(events.t_ns >= self.started_ns) & (events.t_ns <= self.stopped_ns)]
        out = []
        for _, cycle in events.groupby("cycle"):
            sent = cycle.t_ns[cycle.stage == "ocs_command_sent"]
            up = cycle.t_ns[cycle.stage == "port_active"]
            if len(sent) and len(up):
                out.append((int(sent.min()), int(up.max())))
        return out

    def stop(self) -> dict:
        self._stop.set()
        for thread in self._threads:
            thread.join(10.0)
        self.stopped_ns = now_ns()
        if not self.samples:
            return {}
        path = self.ctx.run_dir / "gpu_samples.jsonl"
        with open(path, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(s, separators=(",", ":")) + "\n" for s in self.samples)
            out.flush()
            os.fsync(out.fileno())
        windows = sorted(self.windows or self._event_windows())
        if not windows:
            return {}
        summary = {"samples": len(self.samples), "windows": len(windows), "hosts_total": self.hosts_total, "hosts": {}}
        for host in sorted({s["host"] for s in self.samples}):
            inside, outside = [], []
            for s in (s for s in self.samples if s["host"] == host and s["utilization_gpu"] is not None):
                lo, hi = s["t_ns"] - s["uncertainty_ns"], s["t_ns"] + s["uncertainty_ns"]
                if any(b <= lo and hi <= e for b, e in windows):
                    inside.append(s["utilization_gpu"])
                elif windows[0][0] <= lo and hi <= windows[-1][1] and not any(lo <= e and b <= hi for b, e in windows):
                    outside.append(s["utilization_gpu"])  # between two reconfigurations: the steady state
            summary["hosts"][host] = {
                "n_inside": len(inside), "n_outside": len(outside),
                "mean_util_inside": sum(inside) / len(inside) if inside else None,
                "mean_util_outside": sum(outside) / len(outside) if outside else None,
                "idle_fraction_inside": sum(u <= IDLE_PERCENT for u in inside) / len(inside) if inside else None}
        self.ctx.manifest_extra.setdefault("gpu_view", {})[self.step_name] = summary
        shown = [f"{h} {v['mean_util_inside']:.0f} % (between: {v['mean_util_outside']:.0f} %)"
                 for h, v in summary["hosts"].items() if v["mean_util_inside"] is not None
                 and v["mean_util_outside"] is not None]
        if shown:
            self.ctx.say(f"{self.step_name}: GPU utilisation while the network re-trains: " + ", ".join(shown))
        return summary


@contextlib.contextmanager
def gpu_view(ctx, step, hosts):
    """Sample the GPUs of `hosts` for the duration of the block (nothing on a dry run)."""
    if ctx.dry_run:
        yield None
        return
    view = GpuView(ctx, step.name, hosts).start()
    try:
        yield view
    finally:
        view.stop()


TABLE_HEAD = ["step", "host", "windows", "samples inside", "utilisation inside (%)", "idle inside",
              "samples between", "utilisation between (%)"]


def table_rows(view: dict) -> list[list[str]]:
    """The manifest's `extra.gpu_view` as rows under TABLE_HEAD (summary.md and the HTML report); '–' where a
    host had no sample in that group."""
    def pct(x, scale=1.0):
        return "–" if x is None else f"{scale * x:.0f}"

    return [[step, host, str(s["windows"]), str(v["n_inside"]), pct(v["mean_util_inside"]),
             pct(v["idle_fraction_inside"], 100) + (" %" if v["idle_fraction_inside"] is not None else ""),
             str(v["n_outside"]), pct(v["mean_util_outside"])]
            for step, s in view.items() for host, v in s["hosts"].items()]


def markdown(view: dict) -> list[str]:
    if not view:
        return []
    return (["## GPUs while the network re-trains", "",
             "`nvidia-smi` samples inside the re-training windows (OCS command to the last port ACTIVE, or the "
             "windows a step marks) against between them; a sample whose bound crosses a window edge is in neither.",
             "", "| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
            + ["| " + " | ".join(row) + " |" for row in table_rows(view)] + [""]
            + [f"`{step}`: {len(s['hosts'])} of {s['hosts_total']} hosts sampled (spread evenly over the inventory)."
               for step, s in view.items() if s.get("hosts_total", 0) > len(s["hosts"])])
