"""MoE traffic on the bench: emulated `alltoall_perf` / `ib_write_bw` (real output formats, times from the
current circuits) and the `moe_traffic` playbook step."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, strategies as st

from analysis.mixnet import all_to_all_time, greedy_circuits
from devices.emulated import formats
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.emulated.host.server import EmulatedHostServer
from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests
from devices.ssh import SshTransport
from devices.parsers.common import ParseError
from harness.cli import main
from harness.bench.traffic import check_template, render_command, transfer_seconds
from harness.steps.moe_traffic import MoeTrafficRun
from traces.generate import generate_moe
from traces.moe import moe_phases
from traces.schema import write_moe

ROOT = Path(__file__).resolve().parents[1]
GBIT = 1.25e8  # bytes/s per Gb/s
LATENCY_S = 10e-6  # the emulated tools' default fixed latency
MIB = 1 << 20


def _port(bench, key: str):
    return next(m for m in bench.all_nic_ports() if m.key == key)


def _wire(bench, pairs=(), one_way=()):
    """Replace every patch: full circuits for `pairs`, a single direction for `one_way`; wait until settled."""
    adds = {}
    for a, b in pairs:
        pa, pb = _port(bench, a), _port(bench, b)
        adds[pa.ocs_tx], adds[pb.ocs_tx] = pb.ocs_rx, pa.ocs_rx
    for a, b in one_way:
        adds[_port(bench, a).ocs_tx] = _port(bench, b).ocs_rx
    bench.ocs_apply({}, removes=list(bench.ocs_patches()))
    assert bench.wait_idle(5)
    bench.ocs_apply(adds)
    assert bench.wait_idle(5)


def _run(ssh, command: str) -> str:
    result = ssh.run(command)
    assert result.exit_status == 0, result.stderr
    return result.stdout


A, B, C, D = "gpu1:ens1f0np0", "gpu2:ens1f0np0", "gpu1:ens2f0np0", "gpu3:ens1f0np0"


def test_alltoall_perf_output_parses_and_follows_the_circuits(bench, ssh):
    _wire(bench, pairs=[(A, B)])
    # Rank A sends 512 MiB to B (circuit, 400 Gb/s) and 32 MiB each way to D (packet fabric, 100 Gb/s).
    out = _run(ssh, f"alltoall_perf -n 1 -w 0 --self {A} --peers {B}=512M,{D}=32M")
    result = parse_nccl_tests(out)
    row = result.rows[0]
    assert row.size_bytes == 544 * MIB and row.count == 544 * MIB // 4 and (row.redop, row.root) == ("none", -1)
    assert [r["host"] for r in result.ranks] == ["gpu1", "gpu2", "gpu3"]
    assert result.settings["iters"] == "1" and row.out_of_place.wrong == 0
    circuit_bound = 512 * MIB / (400 * GBIT) + LATENCY_S
    all_packet = 544 * MIB / (100 * GBIT) + LATENCY_S  # what it would take with no circuit
    for phase in (row.out_of_place, row.in_place):
        seconds = phase.time_us / 1e6
        assert circuit_bound * 0.999 <= seconds < all_packet  # a sleep never ends early
        assert phase.algbw_gbs == pytest.approx(row.size_bytes / 1e9 / seconds, rel=0.01, abs=0.01)
        assert phase.busbw_gbs == pytest.approx(phase.algbw_gbs * 2 / 3, abs=0.011)


def test_alltoall_uniform_split_and_size_sweep(bench, ssh):
    _wire(bench)
    out = _run(ssh, f"alltoall_perf -b 3M -e 12M -f 2 -n 1 -w 0 -c 0 --self {A} --peers {B},{D}")
    rows = parse_nccl_tests(out).rows
    assert [r.size_bytes for r in rows] == [3 * MIB, 6 * MIB, 12 * MIB]
    assert all(r.out_of_place.wrong is None for r in rows)
    for r in rows:  # alltoall keeps 1/nranks local: 2/3 of the size crosses the packet fabric
        assert r.out_of_place.time_us / 1e6 >= (r.size_bytes * 2 / 3 / (100 * GBIT) + LATENCY_S) * 0.999


_times = st.floats(0.001, 1e9, allow_nan=False)


@given(st.lists(st.tuples(st.integers(0, 2**40), _times, st.floats(0, 1e5), st.booleans()), min_size=1, max_size=5))
def test_nccl_renderer_roundtrips_through_the_real_parser(rows):
    """Any row the emulator renders parses back, within the printed precision (getFloatStr: 2 decimals,
    or 2 significant digits in e-notation)."""
    rendered = []
    for size, time_us, algbw, check in rows:
        for value, width in ((time_us, 7), (algbw, 6)):
            if value < 10 ** (width - 1):  # fixed point keeps the column; e-notation may overflow it, as in C
                assert len(formats.nccl_float(value, width)) == width
        t = formats.NcclTiming(time_us, algbw, algbw * 3 / 4, 0 if check else None)
        rendered.append((size, size // 4, "float", "none", -1, t, t))
    ranks = [formats.NcclRank(0, "gpu1", 0, 4242, 0x18, "NVIDIA H100 80GB HBM3")]
    text = formats.nccl_tests_output("alltoall_perf", ranks, rendered, min_bytes=1, max_bytes=2, step_factor=2,
                                     warmup_iters=0, iters=1, check=True)
    parsed = parse_nccl_tests(text)
    assert parsed.ranks == [{"rank": 0, "host": "gpu1", "device": 0}]
    for (size, time_us, algbw, check), row in zip(rows, parsed.rows):
        assert (row.size_bytes, row.count) == (size, size // 4)
        for phase in (row.out_of_place, row.in_place):
            assert phase.time_us == pytest.approx(time_us, rel=0.05, abs=0.0051)
            assert phase.algbw_gbs == pytest.approx(algbw, rel=0.05, abs=0.0051)
            assert phase.wrong == (0 if check else None)


@given(st.integers(1, 2**40), st.integers(1, 10**7), st.floats(0.01, 1e6), st.floats(0.01, 1e6), st.booleans())
def test_perftest_renderer_roundtrips_through_the_real_parser(size, iters, peak, average, gbits):
    end = formats.PerftestEnd(lid=0, qpn=0x108, psn=0x6F2A11, rkey=0x1FFFBD, vaddr=0x7F5A4C000000, gid=bytes(16))
    text = formats.ib_write_bw_output("mlx5_3", end, end, [(size, iters, peak, average, average / 100)],
                                      report_gbits=gbits)
    parsed = parse_ib_write_bw(text)
    row = parsed.rows[0]
    assert parsed.unit == ("Gb/sec" if gbits else "MiB/sec") and parsed.settings["Device"] == "mlx5_3"
    assert (row.size_bytes, row.iterations) == (size, iters)
    assert row.bw_peak == round(peak, 2) and row.bw_average == round(average, 2)
    assert parsed.local == {"LID": "0000", "QPN": "0x0108", "PSN": "0x6f2a11", "RKey": "0x1fffbd",
                            "VAddr": "0x007f5a4c000000", "GID": ":".join(["00"] * 16)}


def _write_bw(ssh, peer: str, *extra: str):
    row = parse_ib_write_bw(_run(ssh, " ".join(["ib_write_bw -d mlx5_0 -s 1M -n 200", *extra, peer]))).rows[0]
    assert (row.size_bytes, row.iterations) == (MIB, 200)
    return row


def test_ib_write_bw_circuit_is_much_faster_than_packet_fabric(bench, ssh):
    _wire(bench, pairs=[(A, B)])
    fast, slow = _write_bw(ssh, "gpu2"), _write_bw(ssh, "gpu3")
    assert fast.bw_peak_gbps == pytest.approx(400, rel=1e-4) and slow.bw_peak_gbps == pytest.approx(100, rel=1e-4)
    assert slow.bw_average_gbps <= 100 * (1 + 1e-4) and fast.bw_average_gbps <= 400 * (1 + 1e-4)
    assert fast.bw_average_gbps > 2 * slow.bw_average_gbps  # 4x on an idle machine
    # --report_gbits and the rates on the command line
    row = _write_bw(ssh, "gpu2:ens1f0np0", "--report_gbits", "--link-gbps", "200")
    assert row.unit == "Gb/sec" and row.bw_peak == 200.0


def test_a_circuit_needs_both_directions_and_both_ports_up(bench, ssh):
    _wire(bench, one_way=[(A, B), (B, A)])  # both directions, same as a pair: the control
    assert _write_bw(ssh, B).bw_peak_gbps == pytest.approx(400, rel=1e-4)
    _wire(bench, one_way=[(A, B)])
    assert _write_bw(ssh, B).bw_peak_gbps == pytest.approx(100, rel=1e-4)
    bench.set_port_fault("gpu3", "ens1f0np0", "never_up")
    try:
        _wire(bench, pairs=[(C, D)])  # patched both ways, but D's PHY never trains
        assert bench.nic_snapshot("gpu3", "ens1f0np0").ib_state != "ACTIVE"
        assert _write_bw(ssh, D, "-d", "mlx5_1").bw_peak_gbps == pytest.approx(100, rel=1e-4)
    finally:
        bench.set_port_fault("gpu3", "ens1f0np0", None)


@pytest.mark.parametrize("command", [
    "alltoall_perf --peers gpu9:eth0", "alltoall_perf -g 2 --peers gpu2:ens1f0np0",
    f"alltoall_perf --peers {B}=1M,{D}", "alltoall_perf --peers gpu2:ens1f0np0 --time-scale 0",
    "alltoall_perf --bogus", "ib_write_bw", "ib_write_bw gpu9", "ib_write_bw -d mlx5_7 gpu2", "ib_write_bw -s x gpu2"])
def test_bad_tool_command_lines_fail_cleanly(ssh, command):
    result = ssh.run(command)
    assert result.exit_status == 1 and result.stderr.strip() and "emulator:" not in result.stderr


# ---------------------------------------------------------------------------------------- the step

PAIR = ["gpu1:ens2f0np0", "gpu3:ens1f0np0"]
FILE_ENDPOINTS = ["gpu2:ens2f0np0", "gpu4:ens1f0np0", "gpu1:ens1f0np0", "gpu3:ens2f0np0"]
TRACE = {"iterations": 4, "layers": 1, "micro_batches": 1, "regime_changes": [2], "tokens_per_micro_batch": 2048,
         "hidden_size": 4096, "top_k": 2}


def _playbook(path, steps: list[dict]) -> str:
    path.write_text(yaml.safe_dump({"name": "moe-test", "bench": "emulated:burst-mode", "seed": 4, "cycles": 1,
                                    "steps": steps}, sort_keys=False))
    return str(path)


def _circuit_matrix(labels, keys) -> np.ndarray:
    c = np.zeros((len(keys), len(keys)), dtype=np.int64)
    for label in labels:
        a, b = label.split("<->")
        c[keys.index(a), keys.index(b)] = c[keys.index(b), keys.index(a)] = 1
    return c


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    """One run, two steps: no reconfiguration (the bench starts unpatched), then greedy circuits per regime."""
    tmp = tmp_path_factory.mktemp("moe")
    write_moe(generate_moe(seed=9, ep=4, num_experts=8, ranks_per_server=1, **TRACE), tmp / "ep4.parquet")
    book = _playbook(tmp / "moe.yaml", [
        {"type": "moe_traffic", "name": "static", "reconfigure": "none", **TRACE},
        {"type": "moe_traffic", "name": "regimes", "reconfigure": "per_regime", **TRACE},
        {"type": "moe_traffic", "name": "file", "trace": "ep4.parquet", "reconfigure": "per_iteration",
         "endpoints": FILE_ENDPOINTS, "max_phases": 6},
        # two ranks: all traffic fits one circuit (4x the packet fabric); slowed 10x so that late wake-ups
        # of a loaded machine stay small against the transfer
        {"type": "moe_traffic", "name": "pair", "reconfigure": "per_regime", "endpoints": PAIR, "time_scale": 0.1,
         **TRACE},
        # one command per phase from a launch host (how mpirun-launched nccl-tests run on a real bench)
        {"type": "moe_traffic", "name": "once", "reconfigure": "per_regime", "endpoints": PAIR, "time_scale": 0.1,
         "launch": "once", "launch_host": "gpu1", **TRACE,
         "command": "ib_write_bw -d mlx5_1 -s {bytes} -n 1 --time-scale {time_scale} --report_gbits {args}",
         "args": ["gpu3:ens1f0np0"]}])
    assert main(["run", book, "--out", str(tmp / "runs" / "run"), "--quiet"]) == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def test_step_records_every_phase_and_measured_matches_the_model(moe_run):
    trace = generate_moe(seed=4, ep=8, num_experts=16, ranks_per_server=1, **TRACE)
    phases = list(moe_phases(trace))
    for name, reconfigurations in (("static", 0), ("regimes", 2)):
        frame = pd.read_parquet(moe_run / f"moe_traffic_{name}.parquet")
        summary = json.loads((moe_run / f"moe_traffic_{name}.json").read_text())
        assert len(frame) == len(phases) == summary["phases"] == 4 * 4
        assert summary["reconfigurations"] == reconfigurations and frame["links_up"].all()
        keys = summary["endpoints"]
        for row, ph in zip(frame.itertuples(), phases):
            assert (row.iteration, row.layer, row.phase) == (ph.iteration, ph.layer, ph.phase)
            off = ph.matrix - np.diag(np.diag(ph.matrix))
            assert row.bytes == off.sum()
            circuits = _circuit_matrix(row.circuits, keys)
            assert (circuits.sum(axis=1) <= 1).all()  # one OCS port per endpoint: a matching
            assert row.modelled_s == pytest.approx(all_to_all_time(ph.matrix, circuits, 400 * GBIT, 100 * GBIT))
            assert row.measured_s == pytest.approx(max(row.rank_s))
        # Sleeps never end early and the emulator adds only its fixed latency: measured >= model. The upper
        # bound is generous (a loaded 2-core machine wakes sleepers late), yet far below what a pair
        # mistaken for packet-fabric-only (or a circuit not up) would cost on the slowest phases.
        assert (frame["measured_s"] >= frame["modelled_s"] * 0.999).all()
        assert frame["ratio"].median() < 1.5
        assert summary["ratio_p50"] == pytest.approx(frame["ratio"].median())
    static = pd.read_parquet(moe_run / "moe_traffic_static.parquet")
    regimes = pd.read_parquet(moe_run / "moe_traffic_regimes.parquet")
    assert (static["n_circuits"] == 0).all() and (regimes["n_circuits"] == 4).all()
    assert np.allclose(static["modelled_s"], static["modelled_packet_only_s"])
    # the circuits carry real traffic: the model (exact, no noise) says per-regime wiring is faster
    assert (regimes["modelled_s"] < regimes["modelled_packet_only_s"]).all()
    # oracle: greedy circuits on each regime's mean demand (the trace's regime change is at iteration 2)
    trace = generate_moe(seed=4, ep=8, num_experts=16, ranks_per_server=1, **TRACE)
    per_iteration = [sum(ph.matrix for ph in moe_phases(trace) if ph.iteration == it) for it in range(4)]
    wiring = [greedy_circuits(np.mean(per_iteration[a:b], axis=0), 1, 400 * GBIT, 100 * GBIT)
              for a, b in ((0, 2), (2, 4))]
    keys = json.loads((moe_run / "moe_traffic_regimes.json").read_text())["endpoints"]
    for row in regimes.itertuples():
        assert np.array_equal(_circuit_matrix(row.circuits, keys), wiring[row.iteration >= 2])
    assert regimes.loc[regimes["reconfigured"], "iteration"].tolist() == [0, 2]  # the two wirings differ
    assert (regimes.loc[regimes["reconfigured"], "reconfiguration_s"] > 0.02).all()  # burst-mode OCS: ~25 ms


def test_step_runs_a_trace_file_on_chosen_endpoints(moe_run):
    """A canonical Parquet trace (path relative to the playbook), 4 of the 8 ports in the given order,
    rewired before every iteration; max_phases cuts the run short."""
    trace = generate_moe(seed=9, ep=4, num_experts=8, ranks_per_server=1, **TRACE)
    phases = list(moe_phases(trace))[:6]
    frame = pd.read_parquet(moe_run / "moe_traffic_file.parquet")
    summary = json.loads((moe_run / "moe_traffic_file.json").read_text())
    assert summary["endpoints"] == FILE_ENDPOINTS and summary["phases"] == len(frame) == 6
    # oracle: MixNet's greedy on each iteration's total demand; a rewiring only where it changes
    wiring, changed, previous = {}, [], np.zeros((4, 4), dtype=np.int64)
    for it in sorted({ph.iteration for ph in phases}):
        demand = sum(ph.matrix for ph in moe_phases(trace) if ph.iteration == it)
        wiring[it] = greedy_circuits(demand, 1, 400 * GBIT, 100 * GBIT)
        if not np.array_equal(wiring[it], previous):
            changed.append(it)
        previous = wiring[it]
    assert frame.loc[frame["reconfigured"], "iteration"].tolist() == changed
    for row, ph in zip(frame.itertuples(), phases):
        circuits = _circuit_matrix(row.circuits, FILE_ENDPOINTS)
        assert np.array_equal(circuits, wiring[ph.iteration]) and row.n_circuits == 2
        assert row.modelled_s == pytest.approx(all_to_all_time(ph.matrix, circuits, 400 * GBIT, 100 * GBIT))
        assert len(row.rank_s) == 4 and row.measured_s >= row.modelled_s * 0.999


def test_step_measures_the_circuit_effect(moe_run):
    """Two ranks with a circuit between them: measured follows the circuit rate, far below what the packet
    fabric would take (a port left down or a circuit the tools do not see would show here)."""
    frame = pd.read_parquet(moe_run / "moe_traffic_pair.parquet")
    assert len(frame) == 16 and (frame["n_circuits"] == 1).all() and frame["links_up"].all()
    assert np.allclose(frame["modelled_packet_only_s"], 4 * frame["modelled_s"])
    assert (frame["measured_s"] >= frame["modelled_s"] * 0.999).all()
    assert frame["measured_s"].median() < frame["modelled_packet_only_s"].median() / 2


def test_step_launch_once_runs_one_command_per_phase(moe_run):
    """Two ranks over one circuit: a single ib_write_bw of the heavier rank's bytes is the whole phase, and the
    model (the pair's heavier direction over the circuit) predicts it."""
    frame = pd.read_parquet(moe_run / "moe_traffic_once.parquet")
    summary = json.loads((moe_run / "moe_traffic_once.json").read_text())
    assert summary["launch"] == "once" and len(frame) == 16 and (frame["rank_s"].map(len) == 1).all()
    assert (frame["n_circuits"] == 1).all()
    assert (frame["measured_s"] >= frame["modelled_s"] * 0.999).all()
    assert frame["ratio"].median() < 1.5
    assert frame["measured_s"].median() < frame["modelled_packet_only_s"].median() / 2


def test_step_summary_and_restore(moe_run):
    summary_md = (moe_run / "summary.md").read_text()
    assert "measured / modelled, p50" in summary_md and "dispatch_fwd" in summary_md
    regimes = json.loads((moe_run / "moe_traffic_regimes.json").read_text())
    assert regimes["measured_total_s"] == pytest.approx(regimes["measured_transfer_s"] + regimes["reconfiguration_s"])
    manifest = json.loads((moe_run / "manifest.json").read_text())
    assert "restore_error" not in json.dumps(manifest)


@pytest.mark.parametrize("change, message", [
    ({"reconfigure": "sometimes"}, "reconfigure: expected one of 'none', 'per_regime' or 'per_iteration'"),
    ({"command": "alltoall_perf -b {size}"}, "unknown placeholder {size}"),
    ({"command": "x {bytes!r}"}, "takes no conversion"),
    ({"endpoints": ["gpu1:ens1f0np0", "gpu9:eth0"]}, "endpoints must be"),
    ({"trace": "no-such-trace.parquet"}, "not found"),
    ({"regime_changes": 9}, "cannot generate the trace"),
    ({"launch": "twice"}, "launch: expected one of 'per_endpoint' or 'once'"),
    ({"launch": "once"}, "needs a command template"),
    ({"launch": "once", "command": "run {self}"}, "unknown placeholder {self}"),
    ({"launch": "once", "command": "run {hosts}", "launch_host": "gpu9"}, "launch_host 'gpu9'"),
    # the parameters' field limits (MoeTrafficParams), shared by the link studies
    ({"layers": 0}, "layers: expected a value >= 1, found 0"),
    ({"hidden_size": -4096}, "hidden_size: expected a value >= 1, found -4096"),
    ({"zipf_s": -0.5}, "zipf_s: expected a value >= 0, found -0.5"),
    ({"num_experts": -1}, "num_experts: expected a value >= 0, found -1"),
    ({"regime_changes": "two"}, "regime_changes: expected an integer or a list, found string 'two'"),
])
def test_bad_step_params_are_input_errors(tmp_path, capsys, change, message):
    book = _playbook(tmp_path / "bad.yaml", [{"type": "moe_traffic", "name": "m", **TRACE, **change}])
    assert main(["run", book, "--dry-run", "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "bad.yaml:" in err


@pytest.mark.parametrize("kind", ["link_failures", "link_flaps"])
def test_the_link_studies_check_the_traffic_parameters_alike(tmp_path, capsys, kind):
    book = _playbook(tmp_path / "bad.yaml", [{"type": kind, "name": "m", **TRACE, "layers": 0, "zipf_s": -1.0,
                                              "fabric_command": "fabric_link {plane} {port}"}])
    assert main(["run", book, "--dry-run", "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "layers: expected a value >= 1, found 0" in err and "zipf_s: expected a value >= 0" in err, err
    assert "fabric_command: unknown placeholder {port} (known: {plane}, {leaf}, {spine}, {state})" in err, err
    assert err.count("bad.yaml:") == 3


HOSTILE = ["x; echo pwned > /tmp/pwned", "$(touch /tmp/pwned)", "`id`", "a && echo pwned > /tmp/pwned2", "'\"", ""]


def test_template_values_are_shell_quoted():
    template = "probe {self} {args} -b {bytes}"
    check_template(template)
    values = {"self": HOSTILE[0], "bytes": HOSTILE[1]}
    words = shlex.split(render_command(template, values, HOSTILE))
    assert words == ["probe", HOSTILE[0], *HOSTILE, "-b", HOSTILE[1]]
    with pytest.raises(ValueError, match=r"unknown placeholder \{bytes\.real\}"):
        check_template("probe {bytes.real}")


def test_no_injection_through_a_remote_shell():
    seen: list[list[str]] = []

    def probe(ctx, argv):
        seen.append(argv)
        return 0

    with OpticalBench(load_profile("instant"), seed=1) as bench, \
            EmulatedHostServer(bench, bench.hosts[0], extra_commands={"probe": probe}) as server, \
            SshTransport(server.resource()) as ssh:
        command = render_command("probe {self} {args}", {"self": HOSTILE[3]}, HOSTILE)
        assert ssh.run(command).exit_status == 0
        assert seen == [["probe", HOSTILE[3], *HOSTILE]]
        assert not any("pwned" in path for path in server.fs.files)
        # the control: the same words unquoted do reach the shell as commands
        ssh.run("probe " + " ".join(HOSTILE[:1]))
        assert "/tmp/pwned" in server.fs.files


def test_transfer_seconds_reads_both_tool_formats(bench, ssh):
    _wire(bench, pairs=[(A, B)])
    out = _run(ssh, "ib_write_bw -d mlx5_0 -s 1M -n 100 gpu2")
    row = parse_ib_write_bw(out).rows[0]
    assert transfer_seconds(out, MIB) == pytest.approx(MIB * 100 / (row.bw_average_gbps * GBIT))
    out = _run(ssh, f"alltoall_perf -b 1M -e 4M -n 1 -w 0 --self {A} --peers {B}")
    rows = parse_nccl_tests(out).rows
    assert transfer_seconds(out, 2 * MIB) == rows[1].out_of_place.time_us / 1e6
    assert transfer_seconds(out, 3) == rows[-1].out_of_place.time_us / 1e6
    summary_only = "\n".join(line for line in out.splitlines() if "bus bandwidth" in line or "Out of bounds" in line)
    with pytest.raises(ParseError, match="nccl-tests result rows"):  # a cut output is a clear error, not an IndexError
        transfer_seconds(summary_only, MIB)


def test_step_records_the_gpus_around_each_reconfiguration(moe_run):
    """The GPU view of a moe_traffic step: one window per reconfiguration the step made, in the manifest and
    in summary.md (the emulated job computes while every port of its host is ACTIVE)."""
    view = json.loads((moe_run / "manifest.json").read_text())["extra"]["gpu_view"]
    regimes = json.loads((moe_run / "moe_traffic_regimes.json").read_text())
    assert view["regimes"]["windows"] == regimes["reconfigurations"] == 2
    assert "static" not in view  # it never reconfigures: nothing to compare
    assert set(view["regimes"]["hosts"]) == {k.split(":")[0] for k in regimes["endpoints"]}
    assert all(h["n_outside"] > 0 and h["mean_util_outside"] == 97 for h in view["regimes"]["hosts"].values())
    assert "## GPUs while the network re-trains" in (moe_run / "summary.md").read_text()


def test_a_killed_step_keeps_its_phases_and_a_resume_continues_or_is_refused(tmp_path, monkeypatch, capsys):
    """Each phase's row is on disk before the next phase starts; a run stopped mid-step (SIGINT) resumes after
    its last durable phase, with the plan's circuits re-applied (the stop restored the switch); a trace file
    changed since is refused (exit 2) and nothing is run."""
    write_moe(generate_moe(seed=9, ep=4, num_experts=8, ranks_per_server=1, **TRACE), tmp_path / "ep4.parquet")
    book = _playbook(tmp_path / "moe.yaml", [{"type": "moe_traffic", "name": "m", "trace": "ep4.parquet",
                                              "reconfigure": "per_iteration", "endpoints": FILE_ENDPOINTS,
                                              "max_phases": 6}])
    rows_file = lambda: [json.loads(x) for x in (run_dir / "moe_traffic_m.jsonl").read_text().splitlines()]  # noqa: E731
    real_phase, calls = MoeTrafficRun.run_phase, []

    def run_phase(self, matrix, iters=None):
        calls.append(len(rows_file()) - 1)  # rows on disk (after the header) as the phase starts
        if len(calls) == 4 and stop:
            raise KeyboardInterrupt
        return real_phase(self, matrix, iters)

    monkeypatch.setattr(MoeTrafficRun, "run_phase", run_phase)
    run_dir, stop = tmp_path / "run", True
    assert main(["run", book, "--out", str(run_dir), "--quiet"]) == 130
    assert calls == [0, 1, 2, 3]  # every phase's row durable before the next one ran
    header, *kept = rows_file()
    assert header["trace"] and len(kept) == 3
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and manifest["extra"]["restored"] == {"ocs1": True}
    trace_file = tmp_path / "ep4.parquet"
    original = trace_file.read_bytes()
    write_moe(generate_moe(seed=10, ep=4, num_experts=8, ranks_per_server=1, **TRACE), trace_file)
    calls.clear()
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert "the trace 'ep4.parquet' changed since" in capsys.readouterr().err and calls == []
    trace_file.write_bytes(original)
    stop = False
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert calls == [3, 4, 5]  # only the phases not yet measured
    frame = pd.read_parquet(run_dir / "moe_traffic_m.parquet")
    assert len(frame) == 6 and frame.head(3)["measured_s"].tolist() == [r["measured_s"] for r in kept]
    # the plan's wiring, per iteration, before and after the resume (oracle: greedy on each iteration's demand)
    trace = generate_moe(seed=9, ep=4, num_experts=8, ranks_per_server=1, **TRACE)
    demand = {}
    for ph in moe_phases(trace):
        demand[ph.iteration] = demand.get(ph.iteration, 0) + ph.matrix
    for row in frame.itertuples():
        wanted = greedy_circuits(demand[row.iteration], 1, 400 * GBIT, 100 * GBIT)
        assert np.array_equal(_circuit_matrix(row.circuits, FILE_ENDPOINTS), wanted), row
    assert bool(frame["reconfigured"].iloc[3])  # the stop restored the switch: the resume wired it again
    summary = json.loads((run_dir / "moe_traffic_m.json").read_text())
    assert summary["resumed_after_phases"] == 3 and summary["phases"] == 6


def test_links_that_never_train_time_out_saying_what_was_seen(tmp_path, capsys):
    """A port whose PHY never trains after the circuit moves: the step gives up after `link_timeout_s` and
    says, per port still waiting, what its watch reported before the command and since (no carrier, RDMA not
    ACTIVE); the port that trained is not named."""
    profile = yaml.safe_load((ROOT / "devices" / "profiles" / "burst-mode.yaml").read_text())
    profile["faults"] = {"never_up": [PAIR[0]]}
    (tmp_path / "stuck.yaml").write_text(yaml.safe_dump(profile))
    book = _playbook(tmp_path / "moe.yaml", [{"type": "moe_traffic", "name": "pair", "reconfigure": "per_regime",
                                              "endpoints": PAIR, "link_timeout_s": 0.5, **TRACE,
                                              "iterations": 1, "regime_changes": []}])
    main(["run", book, "--bench", f"emulated:{tmp_path / 'stuck.yaml'}", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "links not up after 0.5 s" in err
    (line,) = [x for x in err.splitlines() if "links not up" in x]
    stuck = line.split(f"{PAIR[0]}: ", 1)[1]
    assert stuck.startswith("saw nothing, missing phy_up, port_active (its watch: before the command ")
    before, since = stuck.split("before the command ", 1)[1].split("; since ", 1)
    assert "carrier 0" in before and "state ACTIVE" not in before, before
    assert "carrier 1" not in since and "state ACTIVE" not in since, since
    assert PAIR[1] not in line
