"""The bench's traffic side: MoE all-to-all phases run as the hosts' transfer tools (nccl-tests or perftest
format, parsed here) over the circuits the run's guard applies, shared by the `moe_traffic` step and the link
studies (`link_failures`, `link_flaps`). See harness.steps.moe_traffic for what a phase is and records."""
from __future__ import annotations

import hashlib
import shlex
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.timing import Deadline, now_ns
from harness.bench.circuits import RetryPolicy
from harness.errors import InputError
from harness.specs import AtLeastOne, Count, Field, Literal, NonNegative, Positive, Spec, model_validator, union_of

RECONFIGURE = ("none", "per_regime", "per_iteration")
# The emulated hosts' alltoall_perf: one rank per endpoint, its own row and column of the phase matrix.
BUILTIN_COMMANDS = {
    "alltoall_perf": "alltoall_perf -b {bytes} -e {bytes} -g 1 -n {iters} -w 0 -c 0 --self {self} --peers {peers} "
                     "--link-gbps {link_gbps} --eps-gbps {eps_gbps} --time-scale {time_scale} {args}",
}
PLACEHOLDERS = ("bytes", "recv_bytes", "host", "netdev", "rdma_dev", "rdma_port", "self", "peers", "iters",
                "link_gbps", "eps_gbps", "time_scale", "args")
# `launch: once`: one collective command per phase (e.g. `mpirun -H {hosts} … alltoall_perf -b {bytes} …`),
# {bytes}/{recv_bytes} then being the heaviest rank's, {hosts} every endpoint's host in rank order.
ONCE_PLACEHOLDERS = ("bytes", "recv_bytes", "hosts", "nranks", "iters", "link_gbps", "eps_gbps", "time_scale",
                     "args")
LAUNCH = ("per_endpoint", "once")


class MoeTrafficParams(Spec):
    """MoE all-to-all phases of a trace as transfers over the bench's circuits (also the link studies'
    traffic parameters)."""

    trace: str = Field("generate", description='a MoE trace file (traces.load_moe) or "generate" '
                                               "(traces.generate_moe, from the run's seed)")
    iterations: AtLeastOne = 6
    layers: AtLeastOne = 2
    micro_batches: AtLeastOne = 1
    regime_changes: union_of((int, list)) = Field(1, description="generate: how many routing shifts, or the "
                                                                 "iterations they start at")
    tokens_per_micro_batch: AtLeastOne = 4096
    hidden_size: AtLeastOne = Field(4096, description="also turns routing-trace tokens into bytes")
    top_k: AtLeastOne = 2
    num_experts: Count = Field(0, description="0: two per endpoint")
    zipf_s: NonNegative = Field(1.2, description="the experts' Zipf skew (0: uniform)")
    drift: float = 0.02
    backward: bool = True
    max_phases: Count = Field(0, description="0: every phase of the trace")
    endpoints: list = Field([], description='NIC ports "host:netdev" of one OCS; empty: every port')
    reconfigure: Literal[RECONFIGURE] = "per_regime"
    command: str = Field("alltoall_perf", description="or a template with {placeholders}, each value shell-quoted")
    launch: Literal[LAUNCH] = Field("per_endpoint", description="per_endpoint: one command per rank | once: one "
                                                                "per phase")
    launch_host: str = Field("", description="launch: once — where (default: the first endpoint's host)")
    args: list = Field([], description="extra words for {args}, each shell-quoted")
    iters: AtLeastOne = Field(1, description="tool iterations per phase")
    link_gbps: Positive = Field(400.0, description="per circuit")
    eps_gbps: Positive = Field(100.0, description="packet fabric, per NIC")
    time_scale: Positive = Field(1.0, description="emulated tools: sleep time / time_scale, report × time_scale")
    link_timeout_s: Positive = Field(15.0, description="how long links may take to train after a wiring")
    command_timeout_s: Positive = 120.0
    poll_interval_s: Positive = Field(0.005, description="how often the hosts' watch reads link state while "
                                                         "links train")

    @model_validator(mode="after")
    def _command_fits_launch(self):
        once = self.launch == "once"
        if once and self.command in BUILTIN_COMMANDS:
            raise ValueError(f"the built-in {self.command} runs one rank per endpoint; launch: once needs a "
                             "command template")
        try:
            check_template(BUILTIN_COMMANDS.get(self.command, self.command),
                           ONCE_PLACEHOLDERS if once else PLACEHOLDERS)
        except ValueError as exc:
            raise ValueError(f"command: {exc}") from None
        return self


class PhaseFailed(DeviceError):
    """A transfer command failed or printed something unparsable."""


@dataclass(frozen=True)
class Endpoint:
    key: str
    host: str
    netdev: str
    rdma_dev: str
    rdma_port: int
    ocs: str
    tx: int
    rx: int


def check_template(template: str, known: tuple[str, ...] = PLACEHOLDERS) -> str:
    """Only `known` placeholders, without conversions or format specs (the values are quoted strings);
    ValueError otherwise."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template ({exc})") from None
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in known:
            raise ValueError(f"unknown placeholder {{{name}}} (known: {', '.join('{' + p + '}' for p in known)})")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} takes no conversion or format spec")
    return template


def render_command(template: str, values: dict[str, object], args: list) -> str:
    """Fill the template; every substituted value is one shell word (shlex.quote), so nothing from a
    playbook or a trace reaches the remote shell unquoted."""
    fields = {name: shlex.quote(str(value)) for name, value in values.items()}
    fields["args"] = " ".join(shlex.quote(str(a)) for a in args)
    return template.format(**fields)


def write_bandwidth_gbps(stdout: str) -> float:
    """ib_write_bw's average bandwidth of its last row (perftest; Gb/s with --report_gbits)."""
    from devices.parsers.bench_tools import parse_ib_write_bw

    return float(parse_ib_write_bw(stdout).rows[-1].bw_average_gbps)


def transfer_seconds(stdout: str, size_bytes: int) -> float:
    """The transfer time a tool printed: nccl-tests — the out-of-place time of the row for `size_bytes`
    (else the last row); perftest — Σ bytes·iterations / average bandwidth over its rows."""
    from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests

    if "BW peak[" in stdout:
        rows = parse_ib_write_bw(stdout).rows
        return sum(r.size_bytes * r.iterations / (r.bw_average_gbps * 1.25e8) for r in rows)
    rows = parse_nccl_tests(stdout).rows
    if not rows:  # a summary without its table (nccl-tests' output cut short): no time to read
        raise ParseError(f"nccl-tests result rows (one for {size_bytes} bytes)", stdout)
    row = next((r for r in rows if r.size_bytes == size_bytes), rows[-1])
    return row.out_of_place.time_us / 1e6


def circuits_from_patches(patches: dict[int, int], endpoints: list[Endpoint]) -> np.ndarray:
    """Pairs patched both ways, as MixNet's symmetric circuit matrix."""
    n = len(endpoints)
    c = np.zeros((n, n), dtype=np.int64)
    for i, a in enumerate(endpoints):
        for j, b in enumerate(endpoints):
            if i != j and patches.get(a.tx) == b.rx and patches.get(b.tx) == a.rx:
                c[i, j] = 1
    return c


def circuit_mapping(circuits: np.ndarray, endpoints: list[Endpoint]) -> dict[int, int]:
    """OCS cross-connects (ingress -> egress) for a one-port-per-endpoint circuit matrix."""
    mapping = {}
    for i, j in zip(*np.nonzero(np.triu(circuits, 1))):
        a, b = endpoints[i], endpoints[j]
        mapping[a.tx], mapping[b.tx] = b.rx, a.rx
    return mapping


def _peer_of(circuits: np.ndarray) -> list[int | None]:
    return [int(np.flatnonzero(row)[0]) if row.any() else None for row in circuits]


def circuit_labels(circuits: np.ndarray, endpoints: list[Endpoint]) -> list[str]:
    return [f"{endpoints[i].key}<->{endpoints[j].key}" for i, j in zip(*np.nonzero(np.triu(circuits, 1)))]


def trace_path(p: dict, step, origin: str | None = None) -> Path:
    """The step's trace file: as given, else relative to the playbook — on a resume (the step then reads the
    run's copy of the playbook) relative to the original playbook, `origin`, as in the run that began it."""
    path = Path(p["trace"]).expanduser()
    if path.is_absolute() or path.exists():
        return path
    for base in (step.file, origin):
        if base and (candidate := Path(base).resolve().parent / path).exists():
            return candidate
    return path


def trace_id(p: dict, step, origin: str | None = None) -> str:
    """What the phases come from: "generate" (the run's seed, which a resume keeps), or the trace file's sha256."""
    if p["trace"] == "generate":
        return "generate"
    path = trace_path(p, step, origin)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


class MoeTraffic:
    """A MoE trace's all-to-all phases on the bench's NIC ports: the trace and its plan, the circuits under it
    (through the run's guard) and the transfer commands, each rank's time as its tool measured it. The
    `moe_traffic` step records its phases; the link studies pull circuits under it."""

    def __init__(self, ctx, step):
        self.ctx, self.step, self.p = ctx, step, step.params
        p, where = self.p, (step.file, step.line)
        self.once = p["launch"] == "once"
        self.template = BUILTIN_COMMANDS.get(p["command"], p["command"])  # fits the launch: the spec
        if p["launch_host"] and p["launch_host"] not in ctx.bench.inventory.hosts:
            raise InputError(f"step {step.name}: launch_host {p['launch_host']!r} is not in the inventory", *where)
        ports = {n.key: n for n in ctx.bench.inventory.nic_ports}
        wanted = [str(k) for k in p["endpoints"]] or list(ports)
        unknown = [k for k in wanted if k not in ports]
        if unknown or len(set(wanted)) != len(wanted) or len(wanted) < 2:
            raise InputError(f"step {step.name}: endpoints must be >= 2 distinct NIC ports of the inventory "
                             f"(unknown: {', '.join(unknown) or 'none'}; known: {', '.join(ports)})", *where)
        self.endpoints = [Endpoint(k, ports[k].host, ports[k].netdev, ports[k].rdma_dev, ports[k].rdma_port,
                                   ports[k].ocs, ports[k].ocs_tx, ports[k].ocs_rx) for k in wanted]
        if len({e.ocs for e in self.endpoints}) != 1:
            raise InputError(f"step {step.name}: all endpoints must be on one OCS (one region)", *where)
        self.ocs = self.endpoints[0].ocs
        self.b_ocs = p["link_gbps"] * 1.25e8
        self.b_eps = p["eps_gbps"] * 1.25e8

    # ------------------------------------------------------------------ trace
    def load_trace(self):
        p, step, n = self.p, self.step, len(self.endpoints)
        where = (step.file, step.line)
        if p["trace"] == "generate":
            from traces.generate import generate_moe

            try:
                trace = generate_moe(seed=self.ctx.seed, iterations=p["iterations"], layers=p["layers"],
                                     micro_batches=p["micro_batches"], num_experts=p["num_experts"] or 2 * n,
                                     top_k=p["top_k"], ep=n, ranks_per_server=1,
                                     tokens_per_micro_batch=p["tokens_per_micro_batch"],
                                     hidden_size=p["hidden_size"], zipf_s=p["zipf_s"], drift=p["drift"],
                                     regime_changes=p["regime_changes"], backward=p["backward"])
            except ValueError as exc:
                raise InputError(f"step {step.name}: cannot generate the trace: {exc}", *where) from None
        else:
            from traces.moe import load_moe

            path = trace_path(p, step, self.ctx.playbook.source)
            if not path.exists():
                raise InputError(f"step {step.name}: trace {p['trace']!r} not found", *where)
            trace = load_moe(path, hidden_size=p["hidden_size"], backward=p["backward"])
            if trace.header.ep > n:
                raise InputError(f"step {step.name}: the trace's EP groups have {trace.header.ep} ranks, but "
                                 f"only {n} endpoints are given", *where)
        return trace

    def phases(self, trace) -> tuple[list, dict[int, np.ndarray]]:
        """The phases to run (rank matrices of the first EP group) and every iteration's summed demand."""
        from traces.moe import moe_phases

        ep = trace.header.ep
        phases, demand = [], {}
        for ph in moe_phases(trace):
            m = ph.matrix[:ep, :ep].astype(float)
            demand[ph.iteration] = demand.get(ph.iteration, 0.0) + m
            if not self.p["max_phases"] or len(phases) < self.p["max_phases"]:
                phases.append(ph._replace(matrix=m))
        if not phases:
            raise InputError(f"step {self.step.name}: the trace has no all-to-all traffic", self.step.file,
                             self.step.line)
        return phases, demand

    def plan(self, trace, phases, demand) -> dict[int, np.ndarray]:
        """Iteration -> demand to wire for, at each iteration where a reconfiguration is due."""
        mode = self.p["reconfigure"]
        iterations = sorted(demand)
        if mode == "none":
            return {}
        if mode == "per_iteration":
            return {it: demand[it] for it in iterations}
        starts = sorted({iterations[0]} | {int(c) for c in trace.regime_changes if iterations[0] < c <= iterations[-1]})
        plan = {}
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else iterations[-1] + 1
            # MixNet wires a regime for its routing: the regime's mean demand (an offline oracle per regime)
            plan[start] = np.mean([demand[it] for it in iterations if start <= it < end], axis=0)
        return plan

    # ------------------------------------------------------------------ bench
    def reconfigure(self, circuits: np.ndarray) -> tuple[float, bool]:
        """Apply `circuits` and wait until every re-pointed port trained a new link (ctx.bench.links.wire, its
        deadline `link_timeout_s`). (seconds, all up)."""
        old_peer, new_peer = _peer_of(self.current), _peer_of(circuits)
        moved = [e for i, e in enumerate(self.endpoints) if new_peer[i] is not None and new_peer[i] != old_peer[i]]
        begin = now_ns()
        wired = self.ctx.bench.links.wire(self.ocs, self.others | circuit_mapping(circuits, self.endpoints),
                                         self.p["link_timeout_s"], ports=moved, policy=self.policy,
                                         watch_us=max(1, round(self.p["poll_interval_s"] * 1e6)))
        self.current = circuits
        if getattr(self, "gpu_view", None) is not None:
            self.gpu_view.window(begin, now_ns())
        if not wired.up:
            self.ctx.say(f"[yellow]{self.step.name}: links not up after {self.p['link_timeout_s']} s: {wired.seen}[/]")
        return (now_ns() - begin) / 1e9, wired.up

    def open_bench(self, n: int) -> list[str]:
        """The switch's guard, the circuits found, one session per host of the first `n` endpoints."""
        # The run's guard restores the circuits found at its start, on the ports moved, however it ends.
        self.guard = self.ctx.bench.circuits(self.ocs)
        self.policy = RetryPolicy(timeout_s=self.p["link_timeout_s"])
        self.original = self.guard.switch.patches()
        used = {x for e in self.endpoints for x in (e.tx, e.rx)}
        self.others = {i: e for i, e in self.original.items() if i not in used and e not in used}
        self.current = circuits_from_patches(self.original, self.endpoints)
        launch = {self.p["launch_host"]} if self.p["launch_host"] else set()
        hosts = sorted({e.host for e in self.endpoints[:n]} | launch)
        self.sessions = self.ctx.bench.hosts.open(hosts)
        return hosts

    # ------------------------------------------------------------------ phases
    def _common(self, iters: int | None = None) -> dict[str, object]:
        return {"iters": iters or self.p["iters"], "link_gbps": f"{self.p['link_gbps']:g}",
                "eps_gbps": f"{self.p['eps_gbps']:g}", "time_scale": f"{self.p['time_scale']:g}"}

    def commands(self, matrix: np.ndarray, iters: int | None = None) -> list[tuple[str, str, int, str]]:
        """(host, label, bytes, command line) per command of one phase (`iters`: the step's by default)."""
        eps = self.endpoints[: matrix.shape[0]]
        off = matrix - np.diag(np.diag(matrix))
        if self.once:
            send, recv = int(off.sum(axis=1).max()), int(off.sum(axis=0).max())
            values = {"bytes": send, "recv_bytes": recv, "hosts": ",".join(e.host for e in eps),
                      "nranks": len(eps), **self._common(iters)}
            host = self.p["launch_host"] or eps[0].host
            return [(host, host, send, render_command(self.template, values, self.p["args"]))]
        out = []
        for i, e in enumerate(eps):
            peers = ",".join(f"{f.key}={int(matrix[i, j])}/{int(matrix[j, i])}" for j, f in enumerate(eps) if j != i)
            send, recv = int(off[i].sum()), int(off[:, i].sum())
            values = {"bytes": send, "recv_bytes": recv, "host": e.host, "netdev": e.netdev, "rdma_dev": e.rdma_dev,
                      "rdma_port": e.rdma_port, "self": e.key, "peers": peers, **self._common(iters)}
            out.append((e.host, e.key, send, render_command(self.template, values, self.p["args"])))
        return out

    def run_phase(self, matrix: np.ndarray, iters: int | None = None) -> tuple[list[float], float]:
        """Every command of the phase at once; (seconds as the tools measured, per command; harness wall s)."""
        def one(item):
            host, label, size, command = item
            try:
                result = self.sessions[host].transport.run(command, deadline=Deadline(self.p["command_timeout_s"]))
            except DeviceError as exc:
                raise PhaseFailed(f"{label}: {exc}") from exc
            if result.exit_status != 0:
                raise PhaseFailed(f"{label}: {command!r} exited {result.exit_status}: "
                                  f"{result.stderr.strip()[-300:]}")
            try:
                return transfer_seconds(result.stdout, size)
            except ParseError as exc:
                raise PhaseFailed(f"{label}: unparsable output of {command!r}: {exc} (exit {result.exit_status}, "
                                  f"stderr {result.stderr.strip()[-200:]!r})") from exc

        begin = now_ns()
        seconds = list(self.pool.map(one, self.commands(matrix, iters)))
        return seconds, (now_ns() - begin) / 1e9
