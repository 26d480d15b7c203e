"""nccl-tests alltoall_perf and perftest ib_write_bw output parsers (formats: protocols.md §3.2, §3.3)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests
from devices.parsers.common import ParseError

NCCL = """# nThread 1 nGpus 1 minBytes 1024 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41000 on     node-a device  0 [0x1b] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41001 on     node-b device  3 [0x9a] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong 
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         
        1024            16     float    none      -1    20.55    0.05    0.02       0    19.87    0.05    0.03       0
     1048576         32768     float    none      -1    123.4    8.50    7.44     N/A    122.9    8.53    7.47     N/A
  8589934592    2147483648     float    none      -1  1.2e+06  7158.3  6263.5       0  1.1e+06  7809.0  6832.9       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 7.455 
#
# Collective test concluded: alltoall_perf
"""

PERF = """
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 CQ Moderation   : 100
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0108 PSN 0x6f2a11 RKey 0x1fffbd VAddr 0x007f5a4c000000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01
 remote address: LID 0000 QPN 0x0109 PSN 0x1a2b3c RKey 0x1fffbe VAddr 0x007f11aa000000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
 65536      5000             45000.12            44987.33\t\t     0.719797
 1048576    5000             46001.00            45990.50\t\t     0.045991
---------------------------------------------------------------------------------------
"""


def test_nccl_rows_and_trailer():
    r = parse_nccl_tests(NCCL)
    assert [row.size_bytes for row in r.rows] == [1024, 1048576, 8589934592]
    row = r.rows[1]
    assert (row.count, row.dtype, row.redop, row.root) == (32768, "float", "none", -1)
    assert (row.out_of_place.time_us, row.out_of_place.algbw_gbs, row.out_of_place.busbw_gbs) == (123.4, 8.5, 7.44)
    assert row.out_of_place.wrong is None and row.in_place.busbw_gbs == 7.47
    assert r.rows[2].out_of_place.time_us == 1.2e6  # getFloatStr falls back to e-notation
    assert r.avg_busbw_gbs == 7.455 and r.out_of_bounds == 0
    assert r.ranks == [{"rank": 0, "host": "node-a", "device": 0}, {"rank": 1, "host": "node-b", "device": 3}]
    assert r.settings["nGpus"] == "1" and r.settings["iters"] == "20"


def test_nccl_busbw_is_algbw_times_n_minus_1_over_n():
    # alltoall on 8 ranks: busBw = algBw · 7/8 (rounded to two decimals in the output).
    row = parse_nccl_tests(NCCL).rows[1]
    assert row.out_of_place.busbw_gbs == pytest.approx(row.out_of_place.algbw_gbs * 7 / 8, abs=0.006)


def test_nccl_rejects_garbage():
    with pytest.raises(ParseError):
        parse_nccl_tests("# nothing here\n")
    with pytest.raises(ParseError):
        parse_nccl_tests("  1024  16  float  none  -1  x  0.05  0.02  0  19.87  0.05  0.03  0\n")


def test_ib_write_bw():
    r = parse_ib_write_bw(PERF)
    assert r.unit == "MiB/sec" and len(r.rows) == 2
    row = r.rows[0]
    assert (row.size_bytes, row.iterations, row.bw_peak, row.bw_average, row.msg_rate_mpps) == \
        (65536, 5000, 45000.12, 44987.33, 0.719797)
    assert row.bw_average_gbps == pytest.approx(44987.33 * 1048576 * 8 / 1e9)
    # MsgRate·size agrees with the average bandwidth (a consistency check on the columns' order).
    assert row.msg_rate_mpps * 1e6 * 65536 / 2**20 == pytest.approx(row.bw_average, rel=1e-4)
    assert r.settings["Device"] == "mlx5_0" and r.settings["Link type"] == "Ethernet"
    assert r.local["QPN"] == "0x0108" and r.remote["PSN"] == "0x1a2b3c"
    assert r.local["GID"].endswith("10:00:00:01") and r.remote["GID"].endswith("10:00:00:02")


def test_ib_write_bw_gbits_and_old_units():
    gb = PERF.replace("[MiB/sec]", "[Gb/sec]")
    assert parse_ib_write_bw(gb).rows[0].bw_average_gbps == 44987.33
    assert parse_ib_write_bw(PERF.replace("MiB/sec", "MB/sec")).unit == "MB/sec"
    with pytest.raises(ParseError):
        parse_ib_write_bw(PERF.replace("[MiB/sec]", "[furlongs]"))
    with pytest.raises(ParseError):
        parse_ib_write_bw("no header here")
    with pytest.raises(ParseError):
        parse_ib_write_bw(PERF.replace(" 65536      5000 ", " 65536 "))


@given(st.integers(1, 2**40), st.integers(1, 10**7), st.floats(0.01, 9999.99), st.floats(0.01, 9999.99))
def test_perftest_row_format_roundtrip(size, iters, peak, avg):
    # Rows exactly as perftest prints them: " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t     %-7.6lf"
    line = " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t     %-7.6lf" % (size, iters, peak, avg, avg / 100)
    text = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n" + line + "\n"
    row = parse_ib_write_bw(text).rows[0]
    assert (row.size_bytes, row.iterations) == (size, iters)
    assert row.bw_peak == round(peak, 2) and row.bw_average == round(avg, 2)
