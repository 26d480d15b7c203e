"""MoE traffic on the bench: emulated `alltoall_perf` / `ib_write_bw` (real output formats, times from the
current circuits) and the `moe_traffic` playbook step."""
from __future__ import annotations

import pytest

from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests

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
