"""Link-failure and link-flap studies during MoE all-to-all replay (issue: Spectrum-X metrics).

`link_failures`: MixNet's greedy circuits for the trace's demand are wired, then for each f in `fail_pct`
(`rounds` times, each round in a seeded random order, so that no f always runs first on a warming bench)
ceil(f·L) of the L circuits (seeded choice) are pulled — an OCS disconnect through the run's CircuitGuard,
the fibre pull of a real bench — and every phase of the trace runs over what survives; the circuits are
restored before the next f. Per f: effective-bandwidth fraction (busBW / the intact fabric's modelled
busBW), latency inflation (p50, p99 of the phase times ÷ at 0 %), proportionality to surviving capacity.

`link_flaps`: `flaps` times, one phase of the trace runs as one long tool invocation (iterations back to
back, sized from `ops_before` short runs to last `lead_ms` + `down_ms` + `tail_ms`); `lead_ms` into it,
ceil(f·L) circuits are pulled for `down_ms` and restored — while the transfer runs. The RDMA data counters of
the pulled circuits' NIC ports are sampled on their hosts every `sample_us` (the agent's `counters`), each
sample put on the harness clock with its uncertainty: the goodput time series. Reaction = link down (the
disconnect sent) → goodput ≥ 95 % of the new steady state, bounded by `analysis.linkfail.reaction_time` over
the counter windows, widened by the clock uncertainty.

Both leave their tables in `linkfail_<step>.json` (and the per-phase Parquet) for `spectrumx_verdict`.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from analysis import linkfail as lf
from devices.errors import DeviceError
from devices.timing import Deadline, now_ns
from harness.config import register_step
from analysis.fabric import MODES
from harness.specs import AfterValidator, Annotated, AtLeastOne, Expect, Field, Literal, Positive
from harness.errors import InputError
from harness.bench.linkstudy import iteration_units, link_provenance
from harness.bench.traffic import (RECONFIGURE, MoeTraffic, MoeTrafficParams, PhaseFailed, check_template,
                                   circuit_mapping, render_command)
from harness.outcome import Check, StepOutcome

Percentages = Annotated[list[Annotated[float, Field(ge=0, lt=100)]], Field(min_length=1),
                        Expect("a list of percentages in [0, 100)")]
Ops = Annotated[int, Field(ge=2), Expect("a value >= 2")]
FABRIC_PLACEHOLDERS = ("plane", "leaf", "spine", "state")


class LinkStudyParams(MoeTrafficParams):
    """The traffic of moe_traffic, and the packet fabric whose leaf–spine links a study pulls (pull: fabric):
    its shape and load balancing as the bench has them (the emulated bench builds it so), and how a link is
    shut / opened on it: a command run on `fabric_host`, e.g. on Cumulus "nv set interface swp{spine} link
    state {state} && nv config apply" behind an ssh to the leaf; the emulated hosts have `fabric_link`."""

    reconfigure: Literal[RECONFIGURE] = "none"
    pull: Literal["fabric", "circuits"] = "fabric"
    planes: AtLeastOne = 2
    per_leaf: AtLeastOne = 4
    spines: AtLeastOne = 4
    load_balancing: Literal[MODES] = "ecmp"
    fabric_command: Annotated[str, AfterValidator(lambda t: check_template(t, FABRIC_PLACEHOLDERS))] = \
        "fabric_link {plane} {leaf} {spine} {state}"
    fabric_host: str = Field("", description="default: the first endpoint's host")
    settle_ms: Positive = Field(10.0, description="after a pull, before measuring: the fabric routed around it")


class LinkFailuresParams(LinkStudyParams):
    """Bandwidth kept as a share of the links fails, each share once per round."""

    fail_pct: Percentages = [0, 10, 25, 50]
    rounds: AtLeastOne = Field(1, description="each round: every share once, in a seeded random order (no share "
                                              "always first)")


class LinkFlapsParams(LinkStudyParams):
    """How transfers react while links go down and come back."""

    fail_pct: Percentages = [10]
    down_ms: Positive = 200.0
    flaps: AtLeastOne = 2
    ops_before: Ops = 4
    lead_ms: Positive = Field(100.0, description="transfer before the pull")
    tail_ms: Positive = Field(150.0, description="transfer after the links are up again")
    sample_us: AtLeastOne = Field(500, description="the counters' sampling interval on the hosts")


class LinkStudy:
    """The bench side both studies share: the circuits wired, pulled and restored through the guard."""

    def __init__(self, ctx, step):
        self.ctx, self.step, self.p = ctx, step, step.params
        self.moe = MoeTraffic(ctx, step)
        self.fail_pct = [float(v) for v in self.p["fail_pct"]]  # in [0, 100): the spec
        self.rng = np.random.default_rng([int(ctx.seed), 13])
        bench = ctx.bench.inventory
        if self.on_fabric and bench.emulated and bench.host_workers:  # refused before anything runs, dry run too
            raise InputError(f"step {step.name}: pull: fabric on an emulated bench whose hosts {bench.host_workers} "
                             f"worker processes serve ({bench.source}: bench.host_workers): the emulated leaf–spine "
                             "lives in one process, its ranks and fabric_link would not meet; serve the hosts from "
                             "the bench's process (harness emulate --workers 0) or use pull: circuits",
                             step.file, step.line)

    @property
    def on_fabric(self) -> bool:
        return self.p.get("pull") == "fabric"

    def setup(self):
        from analysis.mixnet import greedy_circuits

        moe = self.moe
        trace = moe.load_trace()
        self.phases, demand = moe.phases(trace)
        self.n = self.phases[0].matrix.shape[0]
        if self.on_fabric:
            return self._setup_fabric()
        hosts = moe.open_bench(self.n)
        self.full = np.zeros_like(moe.current)
        self.full[: self.n, : self.n] = greedy_circuits(sum(demand.values()), 1, moe.b_ocs, moe.b_eps)
        self.links = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(self.full, 1)))]
        if not self.links:
            raise InputError(f"step {self.step.name}: the trace's demand wires no circuit", self.step.file,
                             self.step.line)
        return hosts

    def _setup_fabric(self):
        """The leaf–spine the endpoints hang off (endpoint i on leaf i // per_leaf of every plane); its links
        are what a pull takes; line rate = the endpoints' physical NIC rate from the inventory."""
        from analysis.fabric import LeafSpine

        p, step, moe = self.p, self.step, self.moe
        where = (step.file, step.line)
        rates = {n.key: n.gbps for n in self.ctx.bench.inventory.nic_ports}
        missing = [e.key for e in moe.endpoints[: self.n] if not rates.get(e.key)]
        if missing:
            raise InputError(f"step {step.name}: the inventory states no line rate (hosts.HOST.nics[].gbps) for "
                             f"{', '.join(missing)}: busBW / line rate needs the NIC's physical rate", *where)
        self.nic_gbps = min(rates[e.key] for e in moe.endpoints[: self.n])
        try:
            self.topo = LeafSpine(self.n, p["planes"], p["per_leaf"], p["spines"], self.nic_gbps)
        except ValueError as exc:
            raise InputError(f"step {step.name}: {exc}", *where) from None
        self.links = self.topo.fabric_links()
        bench = self.ctx.bench.inventory
        self.fabric_host = p["fabric_host"] or moe.endpoints[0].host
        if self.fabric_host not in bench.hosts:
            raise InputError(f"step {step.name}: fabric_host {self.fabric_host!r} is not in the inventory", *where)
        if bench.emulated and p["command"] == "alltoall_perf":  # the emulated tool builds the declared fabric
            spec = (f"planes={p['planes']},per_leaf={p['per_leaf']},spines={p['spines']},"
                    f"lb={p['load_balancing']},seed={int(self.ctx.seed)}")
            moe.p = {**moe.p, "args": [*moe.p["args"], "--fabric", spec]}
        moe.sessions = self.ctx.open_sessions(sorted({e.host for e in moe.endpoints[: self.n]} | {self.fabric_host}))
        self.down: set = set()
        return sorted(moe.sessions)

    def set_fabric(self, links, state: str) -> tuple[int, int]:
        """Every link in `links` shut ("down") or opened ("up") by the fabric command, all in one shell line
        (one round trip: a flap's links go down together); (harness ns it was sent, harness ns it had
        returned)."""
        links = [tuple(link) for link in links]
        sent = now_ns()
        if links:
            cmd = " && ".join(render_command(self.p["fabric_command"], {"plane": plane, "leaf": leaf, "spine": spine,
                                                                        "state": state}, [])
                              for plane, leaf, spine in links)
            if state == "down":  # a change: not once the lease is lost (restoring runs regardless); restored
                self.ctx.bench.check_lease()  # at the end whatever part of the line took effect
                self.down.update(links)
            result = self.moe.sessions[self.fabric_host].transport.run(
                cmd, deadline=Deadline(self.p["link_timeout_s"]))
            if result.exit_status != 0:
                raise PhaseFailed(f"{cmd[:200]!r} exited {result.exit_status}: {result.stderr.strip()[-200:]}")
            if state == "up":
                self.down.difference_update(links)
        return sent, now_ns()

    def leaf_ports(self, links) -> list[int]:
        """The first endpoint on each leaf of `links` (a shut link takes that leaf's uplinks in its plane, shared
        by its NICs); one a leaf: every sampled port is a counter stream at `sample_us` on its host."""
        leaves = {leaf for _, leaf, _ in links}
        return sorted({min(i for i in range(self.n) if self.topo.leaf_of(i) == leaf) for leaf in leaves})

    def restore_fabric(self) -> None:
        if self.on_fabric and getattr(self, "down", None):
            self.set_fabric(sorted(self.down), "up")

    def wire_intact(self) -> None:
        """Every circuit wired and trained (a study measures against an intact fabric, not a half-trained one)."""
        _, up = self.moe.reconfigure(self.full)
        if not up:
            raise PhaseFailed(f"links not up {self.p['link_timeout_s']} s after wiring the intact fabric")

    def pick(self, pct: float) -> list[tuple[int, int]]:
        k = math.ceil(pct / 100 * len(self.links) - 1e-9)
        idx = sorted(self.rng.choice(len(self.links), size=k, replace=False).tolist()) if k else []
        return [self.links[i] for i in idx]

    def without(self, failed) -> np.ndarray:
        c = self.full.copy()
        for i, j in failed:
            c[i, j] = c[j, i] = 0
        return c

    def pull(self, failed) -> int:
        """Disconnect the failed circuits (a fibre pull); the harness ns the command was first sent."""
        moe = self.moe
        circuits = self.without(failed)
        applied = moe.guard.apply(moe.others | circuit_mapping(circuits, moe.endpoints), moe.policy)
        moe.current = circuits
        return applied.first_sent_ns

    def phase_row(self, matrix: np.ndarray, circuits: np.ndarray) -> dict:
        from analysis.mixnet import all_to_all_time

        moe, n = self.moe, self.n
        begin = now_ns()
        rank_s, _ = moe.run_phase(matrix)
        end = now_ns()
        off = matrix - np.diag(np.diag(matrix))
        size = float(max(off.sum(axis=1).max(), off.sum(axis=0).max()))
        measured = max(rank_s)
        # nccl-tests' size counts the rank's chunk to itself: size = off-diagonal bytes · n / (n − 1)
        row = {"start_ns": begin, "end_ns": end, "max_rank_bytes": size * n / (n - 1), "measured_s": measured,
               "bus_bw": float(lf.bus_bandwidth(size * n / (n - 1), measured, n))}
        if self.on_fabric:  # line rate: the NIC's physical rate moves the rank's bytes in line_s
            return {**row, "line_s": size / (self.nic_gbps * 1.25e8)}
        intact = all_to_all_time(matrix, self.full[:n, :n], moe.b_ocs, moe.b_eps)
        surviving = all_to_all_time(matrix, circuits[:n, :n], moe.b_ocs, moe.b_eps)
        return {**row, "line_s": intact, "modelled_intact_s": intact, "modelled_surviving_s": surviving}


def _interval_text(iv: dict) -> str:
    if iv["ci"] is not None:
        return f"{iv['ci'][0]:.3f}–{iv['ci'][1]:.3f}"
    if iv["lower"] is not None:
        return f"≥ {iv['lower']:.3f}"
    return f"needs ≥ {iv['needs_n']} it."


def capacity_kept(g: pd.DataFrame) -> float:
    """The raw capacity left ÷ intact: the surviving leaf–spine links' share (pull: fabric), else the circuit
    model's intact ÷ surviving time."""
    if "capacity_kept" in g:
        return float(g["capacity_kept"].mean())
    return float(g["modelled_intact_s"].sum() / g["modelled_surviving_s"].sum())


def failure_table(frame: pd.DataFrame) -> list[dict]:
    """Per f: busBW fraction of line rate, latency inflation vs f = 0 (iterations as units, with intervals),
    proportionality."""
    base = frame[frame["fail_pct"] == 0]
    rows = []
    for pct, g in frame.groupby("fail_pct", sort=True):
        bus = float(lf.bus_bandwidth(g["max_rank_bytes"].sum(), g["measured_s"].sum(), int(g["n"].iloc[0])))
        line = float(lf.bus_bandwidth(g["max_rank_bytes"].sum(), g["line_s"].sum(), int(g["n"].iloc[0])))
        row = {"fail_pct": float(pct), "failed_links": int(g["failed_links"].iloc[0]),
               "links": int(g["links"].iloc[0]), "phases": int(len(g)),
               "bus_bw_gbps": bus * 8 / 1e9, "line_fraction": float(lf.effective_bandwidth_fraction(bus, line)),
               "p50_ms": float(g["measured_s"].quantile(0.5) * 1e3),
               "p99_ms": float(g["measured_s"].quantile(0.99) * 1e3),
               "capacity_fraction": capacity_kept(g)}
        if len(base):
            infl = {q: lf.inflation_interval(iteration_units(g), iteration_units(base), p)
                    for q, p in (("p50", 0.5), ("p99", 0.99))}
            bus0 = float(lf.bus_bandwidth(base["max_rank_bytes"].sum(), base["measured_s"].sum(),
                                          int(base["n"].iloc[0])))
            cap0 = capacity_kept(base)
            row.update({"iterations": int(iteration_units(g).size),
                        "p50_inflation": infl["p50"]["value"], "p99_inflation": infl["p99"]["value"],
                        "p50_ci": _interval_text(infl["p50"]), "p99_ci": _interval_text(infl["p99"]),
                        "proportionality": lf.proportionality(bus, bus0, row["capacity_fraction"], cap0)})
        rows.append(row)
    return rows


def _md_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    out = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join("–" if r.get(k) is None else format(r[k], f) for k, _, f in cols) + " |")
    return out


FAILURE_COLS = [("fail_pct", "f %", "g"), ("failed_links", "failed", "d"), ("links", "links", "d"),
                ("phases", "phases", "d"), ("bus_bw_gbps", "busBW Gb/s", ".1f"),
                ("line_fraction", "busBW / line", ".3f"), ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"),
                ("iterations", "iterations", "d"), ("p50_inflation", "p50 ÷ 0 %", ".3f"), ("p50_ci", "95 %", "s"),
                ("p99_inflation", "p99 ÷ 0 %", ".3f"), ("p99_ci", "95 %", "s"),
                ("capacity_fraction", "capacity kept", ".3f"), ("proportionality", "BW kept ÷ capacity kept", ".3f")]
FLAP_COLS = [("flap", "flap", "d"), ("failed_links", "links pulled", "d"), ("attempts", "attempts", "d"),
             ("moving_ms", "counters moving after ms", ".0f"), ("down_ms", "down ms", ".0f"),
             ("ports", "ports sampled", "d"), ("samples", "samples", "d"), ("clock_ms", "clock ± ms", ".3f"),
             ("steady_fraction", "steady goodput ÷ before", ".3f"), ("reaction_low_ms", "reaction > ms", ".3f"),
             ("reaction_high_ms", "reaction ≤ ms", ".3f"), ("truth_reaction_ms", "emulator truth ms", ".3f"),
             ("truth_low_ms", "emulator's reaction > ms", ".3f"), ("truth_high_ms", "emulator's ≤ ms", ".3f"),
             ("reroute_ms", "emulator reroute ms", ".3f"),
             ("recovered_high_ms", "back ≤ ms after restore", ".3f")]


def _write(ctx, step, kind: str, frame: pd.DataFrame, table: list[dict], prov: dict, failure: str | None) -> dict:
    from harness import record as rec

    parquet = ctx.run_dir / f"linkfail_{step.name}.parquet"
    frame.to_parquet(parquet, index=False)
    summary = {"kind": kind, "table": table, "provenance": prov, "failure": failure, "parquet": parquet.name,
               "n_endpoints": int(frame["n"].iloc[0]) if len(frame) else 0}
    rec.write_json_atomic(ctx.run_dir / f"linkfail_{step.name}.json", summary)
    return summary


@register_step("link_failures", LinkFailuresParams)
def link_failures(ctx, step) -> StepOutcome:
    study = LinkStudy(ctx, step)
    if ctx.dry_run:
        return StepOutcome(ok=True, summary_md=f"(dry run: link failures at {study.fail_pct} %, not run)")
    study.setup()
    records, failure = [], None
    with ThreadPoolExecutor(max_workers=max(study.n, 1), thread_name_prefix=f"linkfail-{step.name}") as pool:
        study.moe.pool = pool
        try:
            order = [(rnd, float(pct)) for rnd in range(step.params["rounds"])
                     for pct in study.rng.permutation(study.fail_pct)]
            for rnd, pct in order:
                failed = study.pick(pct)
                if study.on_fabric:  # the draw is the unit: its phases share the links it failed
                    study.restore_fabric()
                    study.set_fabric(failed, "down")
                    time.sleep(study.p["settle_ms"] / 1e3)
                    circuits, extra = None, {"unit": str(rnd), "capacity_kept":
                                             study.topo.fabric_capacity(failed) / study.topo.fabric_capacity()}
                else:
                    study.wire_intact()
                    study.pull(failed)
                    circuits, extra = study.without(failed), {}
                for ph in study.phases:
                    row = study.phase_row(ph.matrix, circuits)
                    records.append({"fail_pct": pct, "failed_links": len(failed), "links": len(study.links),
                                    "n": study.n, "round": rnd, "iteration": ph.iteration, "layer": ph.layer, "phase": ph.phase,
                                    **extra, **row})
        except (DeviceError, PhaseFailed) as exc:
            failure = str(exc)
        finally:
            try:
                study.restore_fabric()
            except (DeviceError, PhaseFailed) as again:
                failure = f"{failure + '; ' if failure else ''}restoring the fabric links: {again}"
    frame = pd.DataFrame.from_records(records)
    table = failure_table(frame) if len(frame) else []
    prov = _fabric_provenance(ctx, study)
    summary = _write(ctx, step, "failures", frame, table, prov, failure)
    if study.on_fabric:
        t = study.topo
        what = (f"{len(study.links)} leaf–spine links ({t.planes} planes × {t.leaves} leaves × {t.spines} spines, "
                f"{t.link_gbps:g} Gb/s each; {study.n} NICs at {t.nic_gbps:g} Gb/s = line rate, "
                f"{study.p['load_balancing']}); f % of them shut (ceil), a fresh seeded draw per round (the unit), "
                f"every phase of the trace per f; capacity kept = the surviving leaf–spine links' share.")
    else:
        what = (f"{len(study.links)} OCS-carried links between {study.n} endpoints; f % of them pulled (ceil), "
                "every phase of the trace per f.")
    md = [f"## Link failures ({step.name})", "", what, ""]
    md += _md_table(table, FAILURE_COLS) + [""] + ([f"**Stopped:** {failure}", ""] if failure else [])
    checks = [Check(name="every fraction ran", ok=failure is None and len(table) == len(set(study.fail_pct)),
                    detail=failure or f"{len(table)}/{len(study.fail_pct)}")]
    return StepOutcome(ok=checks[0]["ok"], checks=checks, summary=summary, summary_md="\n".join(md),
                       artifacts=[summary["parquet"], f"linkfail_{step.name}.json"], data={"linkfail": summary})


def _fabric_provenance(ctx, study: LinkStudy) -> dict:
    """The run's provenance; a study over the leaf–spine names its fabric and (emulated) data plane."""
    prov = link_provenance(ctx.bench)
    if study.on_fabric:
        t = study.topo
        prov["fabric"] = {"planes": t.planes, "leaves": t.leaves, "spines": t.spines, "per_leaf": t.per_leaf,
                          "link_gbps": t.link_gbps, "nic_gbps": t.nic_gbps, "links": len(study.links),
                          "load_balancing": study.p["load_balancing"], "line_rate": "the NICs' physical rate "
                          "(inventory gbps)", "unit": "round (one draw of failed links)"}
        if ctx.bench.truth:
            prov["data_plane"] = ("emulated: alltoall_perf's ranks as one collective over the declared leaf–spine "
                                  "(devices/emulated/leafspine.py: analysis.fabric's max-min fair fluid, "
                                  f"{study.p['load_balancing']}, shut links routed around after the detection delay)")
    return prov


class TransferTooShort(PhaseFailed):
    """A flap's transfer ended before the link had been down long enough to show a steady state."""


class FlapSeries:
    """While open, on the hosts of `endpoints`: their RDMA data counters sampled by the agent (`counters`) and
    their link state watched by it (`watch`), every `interval_us`. Host timestamps are put on the harness
    clock with their uncertainty when read."""

    def __init__(self, sessions: dict, endpoints, interval_us: int):
        from harness.bench.readers import shared_readers

        self.sessions, self.readers = sessions, shared_readers()
        self.raw: dict[str, list[tuple[int, int]]] = {e.key: [] for e in endpoints}  # key -> (host ns, words)
        self.downs: dict[str, list[tuple[int, int]]] = {e.key: [] for e in endpoints}  # carrier 0: (host ns, interval)
        self.host_of = {e.key: e.host for e in endpoints}
        self.problems: list[str] = []
        self.streams, self.closed, self.ends = [], False, 0
        by_host: dict[str, list] = {}
        for e in endpoints:
            by_host.setdefault(e.host, []).append(e)
        for host, eps in by_host.items():
            agent = sessions[host].agent
            key_of = {f"{e.rdma_dev}/{e.rdma_port}": e.key for e in eps} | {e.netdev: e.key for e in eps}
            counters = agent.counters([(e.rdma_dev, e.rdma_port) for e in eps], interval_us)
            watch = agent.watch([(e.netdev, e.rdma_dev, e.rdma_port) for e in eps], interval_us, 0)
            for stream, parse in ((counters, self._counter), (watch, self._watch)):
                self.streams.append(stream)
                self.readers.add(stream, lambda _recv, line, parse=parse, key_of=key_of: parse(line, key_of),
                                 self._ended)

    def _counter(self, line: str, key_of: dict) -> None:
        from harness.bench.hosts import parse_counter_line

        if line.strip():
            try:
                c = parse_counter_line(line)
                self.raw[key_of[c.port]].append((c.host_ns - c.read_ns // 2, c.xmit_words))
            except (DeviceError, KeyError) as exc:
                self.problems.append(f"{line!r}: {exc}")

    def _watch(self, line: str, key_of: dict) -> None:
        from harness.bench.hosts import parse_watch_line

        if line.strip():
            try:
                w = parse_watch_line(line)
            except DeviceError as exc:
                self.problems.append(str(exc))
                return
            if w.field == "carrier" and w.value == "0" and w.interval_ns > 0:  # a change, not the initial value
                self.downs[key_of[w.netdev]].append((w.host_ns, w.interval_ns))

    def _ended(self, reason: str) -> None:
        self.ends += 1
        if not self.closed:
            self.problems.append(f"agent stream ended: {reason.strip()[:200]}")

    def wait_past(self, t_ns: int, timeout_s: float = 5.0) -> None:
        """Until every endpoint has a counter sample after harness time `t_ns` (they arrive in batches)."""
        deadline = now_ns() + int(timeout_s * 1e9)
        while now_ns() < deadline and not self.problems:
            if all(rows and self.sessions[self.host_of[k]].to_harness(rows[-1][0])[0] > t_ns
                   for k, rows in self.raw.items()):
                return
            time.sleep(0.01)

    def wait_moving(self, timeout_s: float) -> int:
        """Until every endpoint's counter has moved since the series opened (its transfer runs); harness ns."""
        deadline = now_ns() + int(timeout_s * 1e9)
        while now_ns() < deadline and not self.problems:
            if all(rows and rows[-1][1] > rows[0][1] for rows in self.raw.values()):
                break
            time.sleep(0.002)
        return now_ns()

    def wait_down(self, after_ns: int, timeout_s: float) -> int:
        """Until a carrier drop after `after_ns` is seen; its latest harness ns (now, if none in time)."""
        deadline = now_ns() + int(timeout_s * 1e9)
        while now_ns() < deadline and not self.problems:
            seen = self.link_down(after_ns)
            if seen is not None:
                return seen[0]
            time.sleep(0.002)
        return now_ns()

    def close(self, timeout_s: float = 2.0) -> None:
        """End the streams as the agent expects (EOF on stdin: it stops, the host ends the command), and
        only then close them — never a channel under the reader thread that still serves it."""
        self.closed = True
        for stream in self.streams:
            stream.closed_by_us = True
            try:
                stream.close_stdin()
            except (OSError, EOFError, DeviceError):
                pass
        deadline = now_ns() + int(timeout_s * 1e9)
        while self.ends < len(self.streams) and now_ns() < deadline:
            time.sleep(0.005)
        for stream in self.streams:
            self.readers.remove(stream)
            stream.close()

    def series(self, key: str, exact=None) -> tuple[np.ndarray, np.ndarray, int]:
        """(harness ns, octets sent, the largest clock uncertainty ns) of one endpoint's counter samples; with
        `exact(host, host ns)` (an emulator's own clocks) their true instants, uncertainty 0."""
        session = self.sessions[self.host_of[key]]
        rows = sorted(set(self.raw[key]))
        conv = ([session.to_harness(host_ns) for host_ns, _ in rows] if exact is None else
                [(exact(self.host_of[key], host_ns), 0, 0) for host_ns, _ in rows])
        t = np.asarray([c[0] for c in conv], dtype=np.int64)
        return t, np.asarray([w * 4 for _, w in rows], dtype=float), max((c[2] for c in conv), default=0)

    def link_down(self, after_ns: int) -> tuple[int, int] | None:
        """(latest, earliest) harness ns of the first carrier drop among the endpoints after `after_ns`: the
        watcher saw it within (host_ns − interval, host_ns]; widened by the clock uncertainty."""
        best = None
        for key, rows in self.downs.items():
            session = self.sessions[self.host_of[key]]
            for host_ns, interval in rows:
                t, _, unc = session.to_harness(host_ns)
                if t + unc > after_ns and (best is None or t < best[0]):
                    best = (t + unc, t - interval - unc)
        return best


def flap_reaction(samples: dict[str, tuple[np.ndarray, np.ndarray, int]], begin_ns: int, sent_ns: int, up_ns: int,
                  interval_s: float, seen: tuple[int, int], steady: dict[str, float] | None = None) -> dict:
    """Per flap, over the sampled ports' counter windows (`samples`: per port, harness ns, octets sent and the
    clock uncertainty ns; the last port to recover): the reaction from the link down — somewhere in `seen`
    (latest, earliest harness ns: a carrier drop within the watcher's interval, or the shut commands' span)
    — to goodput ≥ 95 % of the new steady state, bounds that hold for any down instant in `seen`, widened by
    the clock uncertainty; the steady goodput after ÷ before (the median windows of the second halves of
    [begin, down) and of [the change sent at `sent_ns`, up) while the transfer ran; `steady`: per port, a
    steady state to judge against instead); the first window after the restore back at ≥ 95 % of before."""
    down_hi, down_lo = seen
    lows, highs, fractions, backs, count, clock, spanned, steadies = [], [], [], [], 0, 0, True, {}
    up = (up_ns - down_hi) / 1e9
    early = (down_lo - down_hi) / 1e9
    sent = (sent_ns - down_hi) / 1e9
    for key, (t, octets, unc) in samples.items():
        count, clock = count + len(t), max(clock, unc)
        start, end, good = lf.counter_windows((t - down_hi) / 1e9, octets)
        moving = np.flatnonzero(good > 0)
        # the steady state: the second half of the link's down time while the transfer still ran
        last = min(up, float(end[moving[-1]])) if moving.size else 0.0
        if last < 20 * interval_s:
            raise TransferTooShort(f"{key}: the transfer ran {last * 1e3:.2f} ms of the link's down time, too short "
                                   "for a steady state (raise tail_ms)")
        try:
            r = lf.reaction_time(start, end, good, 0.0, (sent + last) / 2, last,
                                 steady=None if steady is None else steady[key])
        except ValueError as exc:
            raise PhaseFailed(f"{key}: no reaction from {len(t)} counter samples: {exc}") from None
        steadies[key] = r.steady
        spanned = spanned and last == up
        # the link may have gone down as early as down_lo: a window starting since then that is already at 95 %
        # of the new steady state may be the reaction's, which can then be as short as 0
        soon = bool(((start >= early) & (start < 0) & (good >= 0.95 * r.steady)).any())
        lead = (start >= (begin_ns - down_hi) / 2e9) & (end <= early)
        before = float(np.median(good[lead])) if lead.any() else float("nan")
        lows.append(0.0 if soon else r.low_s)
        highs.append(r.high_s if r.reached else float("inf"))
        fractions.append(r.steady / before if before > 0 else float("nan"))
        back = np.flatnonzero((start >= up) & (good >= 0.95 * before))
        backs.append(float(end[back[0]] - up) if back.size else float("inf"))
    high, widen = max(highs), clock / 1e9
    return {"ports": len(samples), "samples": count, "clock_ms": clock / 1e6, "down_seen_ns": [down_lo, down_hi],
            "steady_bytes_s": steadies,
            "down_ms": (up_ns - down_hi) / 1e6, "sent_to_down_ms": (down_hi - sent_ns) / 1e6,
            "reaction_low_ms": max(0.0, (max(lows) - widen) * 1e3),
            "reaction_high_ms": (high + (down_hi - down_lo) / 1e9 + widen) * 1e3 if np.isfinite(high) else None,
            "reached": bool(np.isfinite(high)), "spanned": spanned,
            "steady_fraction": float(min(fractions)) if all(np.isfinite(fractions)) else None,
            "recovered_high_ms": (max(backs) + widen) * 1e3 if np.isfinite(max(backs)) else None}


@register_step("link_flaps", LinkFlapsParams)
def link_flaps(ctx, step) -> StepOutcome:
    p = step.params
    study = LinkStudy(ctx, step)
    if ctx.dry_run:
        return StepOutcome(ok=True, summary_md=f"(dry run: {p['flaps']} flaps of {p['down_ms']} ms, not run)")
    study.setup()
    matrix = study.phases[0].matrix
    records, table, failure = [], [], None
    pct = max(study.fail_pct)
    moe = study.moe
    with ThreadPoolExecutor(max_workers=max(study.n, 1), thread_name_prefix=f"linkflap-{step.name}") as pool, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"linkflap-{step.name}-op") as launcher:
        moe.pool = pool
        try:
            if not study.on_fabric:
                study.wire_intact()
            overhead_s = 0.0  # what a flap took beyond lead + down + tail (the switch, a loaded host), seen so far
            if study.on_fabric:  # a flap's shut and open are a round trip each to fabric_host: budget them at once
                t0 = now_ns()
                moe.sessions[study.fabric_host].transport.run("true", deadline=Deadline(p["link_timeout_s"]))
                overhead_s = 2 * (now_ns() - t0) / 1e9

            def one_flap(failed, iters):
                """Pull `failed` while one transfer of `iters` runs; (row, series, times) or TransferTooShort."""
                nonlocal overhead_s
                # a fabric link: the NICs on its leaf (their uplinks in its plane); a circuit: its two ends
                pulled = (study.leaf_ports(failed) if study.on_fabric else sorted({i for link in failed for i in link}))
                hosts = sorted({moe.endpoints[i].host for i in pulled})
                for host in hosts:  # fresh clock fits around the flap: its samples are converted with them
                    moe.sessions[host].sync_clock()
                series = FlapSeries(moe.sessions, [moe.endpoints[i] for i in pulled], p["sample_us"])
                try:
                    launched_ns = now_ns()
                    running = launcher.submit(moe.run_phase, matrix, iters)
                    begin_ns = series.wait_moving(p["command_timeout_s"])  # every pulled port's rank started
                    time.sleep(max(0.0, (begin_ns + p["lead_ms"] * 1e6 - now_ns()) / 1e9))
                    if study.on_fabric:  # shut: down between the first command sent and the last returned
                        down_ns, done_ns = study.set_fabric(failed, "down")
                        down_seen, seen = (done_ns, down_ns), done_ns
                    else:
                        down_ns, down_seen = study.pull(failed), None
                        seen = series.wait_down(down_ns, p["link_timeout_s"])  # down_ms counts from the link down
                    time.sleep(max(0.0, (seen + p["down_ms"] * 1e6 - now_ns()) / 1e9))
                    up_ns = now_ns()
                    if study.on_fabric:
                        study.set_fabric(failed, "up")
                    else:
                        study.wire_intact()  # restore: reconnect and wait until the links trained
                    overhead_s = max(overhead_s, (now_ns() - begin_ns) / 1e9 - (p["lead_ms"] + p["down_ms"]) / 1e3)
                    _, wall_s = running.result()
                    series.wait_past(now_ns())
                finally:
                    series.close()
                for host in hosts:
                    moe.sessions[host].sync_clock()
                if series.problems:
                    raise PhaseFailed("; ".join(series.problems[:3]))
                keys = [moe.endpoints[i].key for i in pulled]
                moving_ms = (begin_ns - launched_ns) / 1e6
                if down_seen is None:
                    down_seen = series.link_down(down_ns)
                    if down_seen is None:
                        raise PhaseFailed(f"no carrier drop seen on {', '.join(keys)} after the disconnect")
                args = (begin_ns, down_ns, up_ns, p["sample_us"] / 1e6)
                try:
                    row = flap_reaction({k: series.series(k) for k in keys}, *args, down_seen)
                except TransferTooShort as exc:  # a late start is what shortens it: say how late
                    raise TransferTooShort(f"{exc}; its counters moved {moving_ms:.0f} ms after the launch") from None
                if ctx.bench.truth and study.on_fabric:
                    truth = ctx.bench.truth.fabric_flap(failed, down_ns)
                    row["reroute_ms"] = None if truth is None else (truth[1] - truth[0]) / 1e6
                    if truth is not None:
                        # the emulator's own answer: the same counter samples at their true instants, from the
                        # last shut link's true down, against the same steady state (the reroute is a reference
                        # only: a NIC's goodput varies within each transfer as its flows end, so the first window
                        # back at 95 % can wait for the next transfer)
                        exact = {k: series.series(k, ctx.bench.truth.harness_ns) for k in keys}
                        oracle = flap_reaction(exact, *args, (truth[0], truth[0]), row["steady_bytes_s"])
                        row["truth_low_ms"], row["truth_high_ms"] = oracle["reaction_low_ms"], oracle["reaction_high_ms"]
                elif ctx.bench.truth:
                    truth = ctx.bench.truth.flap(keys, down_ns)
                    row["truth_reaction_ms"] = None if truth is None else (truth[1] - truth[0]) / 1e6
                row.update(iters=iters, op_s=wall_s, moving_ms=moving_ms)
                return row, series, pulled, (down_ns, up_ns)

            for flap in range(p["flaps"]):
                failed = study.pick(pct)
                before = [study.phase_row(matrix, None if study.on_fabric else study.full)
                          for _ in range(p["ops_before"])]
                # one invocation: warm-up 0, `iters` out-of-place then `iters` in-place transfers back to back,
                # long enough for lead + down + tail and what the flaps so far took beyond that; a transfer that
                # ended before the link had been down long enough is run again, 4 × longer and sized anew from
                # what the failed attempt took (a loaded bench's commands) — at most twice
                per_transfer_s = float(np.median([r["measured_s"] for r in before]))
                for attempt in range(3):
                    span_s = (p["lead_ms"] + p["down_ms"] + p["tail_ms"]) / 1e3 + 2 * overhead_s
                    iters = max(1, math.ceil(4**attempt * span_s / (2 * per_transfer_s)))
                    try:
                        row, series, pulled, (down_ns, up_ns) = one_flap(failed, iters)
                        break
                    except TransferTooShort as exc:
                        if attempt == 2:
                            raise
                        ctx.say(f"[yellow]{step.name}: flap {flap}: {exc}; again with a 4 × longer transfer[/]")
                table.append({"flap": flap, "failed_links": len(failed), "attempts": attempt + 1, **row})
                for i in pulled:
                    t, octets, unc = series.series(moe.endpoints[i].key)
                    records += [{"flap": flap, "endpoint": moe.endpoints[i].key, "t_ns": int(a), "octets": float(b),
                                 "clock_uncertainty_ns": int(unc), "disconnect_sent_ns": down_ns,
                                 "down_seen_ns": row["down_seen_ns"][1], "up_ns": up_ns,
                                 "n": study.n, "failed_links": len(failed)} for a, b in zip(t, octets)]
                if not row["spanned"]:
                    ctx.say(f"[yellow]{step.name}: flap {flap}: the transfer ended before the link came back "
                            f"(raise tail_ms)[/]")
        except (DeviceError, PhaseFailed) as exc:
            failure = str(exc)
        finally:
            try:
                study.restore_fabric()
            except (DeviceError, PhaseFailed) as again:
                failure = f"{failure + '; ' if failure else ''}restoring the fabric links: {again}"
    frame = pd.DataFrame.from_records(records)
    summary = _write(ctx, step, "flaps", frame, table, _fabric_provenance(ctx, study), failure)
    if study.on_fabric:
        t = study.topo
        what = (f"{len(study.links)} leaf–spine links ({t.planes} planes × {t.leaves} leaves × {t.spines} spines, "
                f"{study.p['load_balancing']}); ceil({pct:g} %) of them shut by the fabric command for "
                f"{p['down_ms']:g} ms while one transfer runs, a fresh draw per flap; reaction = the last link down "
                f"(between the shut line's sending and its return) → goodput ≥ 95 % of the new steady state, over the "
                f"RDMA counters of the first NIC on each shut link's leaf")
    else:
        what = (f"ceil({pct:g} %) of {len(study.links)} OCS-carried links pulled for {p['down_ms']:g} ms while one "
                f"transfer runs; reaction = link down (carrier drop) → goodput ≥ 95 % of the new steady state, over "
                f"the pulled ports' RDMA counters")
    md = [f"## Link flaps ({step.name})", "", f"{p['flaps']} flaps: {what}, sampled every {p['sample_us']} µs on "
          f"their hosts (bounds widened by the clock uncertainty).", ""]
    md += _md_table(table, FLAP_COLS) + [""] + ([f"**Stopped:** {failure}", ""] if failure else [])
    checks = [Check(name="every flap ran", ok=failure is None and len(table) == p["flaps"],
                    detail=failure or f"{len(table)}/{p['flaps']}")]
    if study.on_fabric and ctx.bench.truth and table:
        # the emulator's own reaction (its true sample instants and shut instant) within the measured bounds:
        # the clocks' uncertainty and the shut line's span are honest
        inside = [r.get("truth_low_ms") is not None and r["reaction_low_ms"] <= r["truth_low_ms"] + 1e-9
                  and (r["reaction_high_ms"] is None if r.get("truth_high_ms") is None
                       else r["reaction_high_ms"] is not None and r["truth_high_ms"] <= r["reaction_high_ms"] + 1e-9)
                  for r in table]
        checks.append(Check(name="reaction bounds contain the emulator's", ok=all(inside),
                            detail=f"{sum(inside)}/{len(inside)} flaps"))
        md += ["The emulator's reaction: the same counter samples at their true instants, from the last shut link's "
               "true down, against the same steady state. Its reroute (the last shut link dark → routed around) is "
               "a reference only: a NIC's goodput varies within each transfer of the collective as its flows end, "
               "so the first window back at 95 % of the new median can wait for the next transfer.", ""]
    elif ctx.bench.truth and table:
        inside = [r["reaction_low_ms"] < (r.get("truth_reaction_ms") or -1) <= (r["reaction_high_ms"] or -1)
                  for r in table]
        checks.append(Check(name="reaction bounds contain the emulator's truth", ok=all(inside),
                            detail=f"{sum(inside)}/{len(inside)} flaps"))
    return StepOutcome(ok=all(c["ok"] for c in checks), checks=checks, summary=summary, summary_md="\n".join(md),
                       artifacts=[summary["parquet"], f"linkfail_{step.name}.json"], data={"linkfail": summary})
