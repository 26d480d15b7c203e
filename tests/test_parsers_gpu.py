"""nvidia-smi --query-gpu CSV parser: the real captures of the shared spec (§3.1) and emulator output."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from devices.emulated import formats
from devices.parsers import ParseError
from devices.parsers.gpu import (parse_nvidia_smi_csv, parse_nvidia_smi_table, parse_nvidia_smi_topo,
                                 parse_nvidia_timestamp)


def test_real_capture_with_header_and_nounits():
    text = ("timestamp, utilization.gpu [%], utilization.memory [%], memory.used [MiB], memory.total [MiB]\n"
            "2024/03/13 07:04:28.836, 0, 0, 0, 81920\n")
    q = parse_nvidia_smi_csv(text)
    assert q.fields == ("timestamp", "utilization.gpu", "utilization.memory", "memory.used", "memory.total")
    assert q.units == (None, "%", "%", "MiB", "MiB")
    assert q.records() == [{"timestamp": "2024/03/13 07:04:28.836", "utilization.gpu": 0, "utilization.memory": 0,
                            "memory.used": 0, "memory.total": 81920}]


def test_timestamps_of_the_real_captures_read_as_utc_nanoseconds():
    import datetime
    from pathlib import Path

    for path in sorted((Path(__file__).parent / "data" / "real" / "nvidia-smi").glob("*.csv.txt")):
        lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        assert lines[0].startswith("timestamp, "), path.name
        stamp = parse_nvidia_smi_csv("\n".join(lines[:2])).column("timestamp")[0]
        when = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        assert parse_nvidia_timestamp(stamp) == round(when.timestamp() * 1000) * 1_000_000, (path.name, stamp)
    for bad in ("2024/03/13 07:04:28", "2024-03-13 07:04:28.836", "[N/A]"):
        with pytest.raises(ParseError):
            parse_nvidia_timestamp(bad)


def test_real_capture_with_units():
    text = ("driver_version, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
            "temperature.gpu\n535.129.03, NVIDIA A100-SXM4-40GB, 40960 MiB, 4 MiB, 40334 MiB, 0 %, 31\n")
    (row,) = parse_nvidia_smi_csv(text).records()
    assert row == {"driver_version": "535.129.03", "name": "NVIDIA A100-SXM4-40GB", "memory.total": 40960,
                   "memory.used": 4, "memory.free": 40334, "utilization.gpu": 0, "temperature.gpu": 31}


def test_noheader_needs_the_field_list_and_unsupported_values_are_none():
    text = "0, [N/A], 69.87 W\n1, [Not Supported], 70.01 W\n"
    q = parse_nvidia_smi_csv(text, ["index", "fan.speed", "power.draw"], header=False)
    assert q.column("fan.speed") == [None, None]
    assert q.column("power.draw") == [69.87, 70.01]
    with pytest.raises(ParseError, match="field list"):
        parse_nvidia_smi_csv(text, header=False)
    with pytest.raises(ParseError, match="2 comma-separated values"):
        parse_nvidia_smi_csv(text, ["index", "power.draw"], header=False)
    with pytest.raises(ParseError, match="header fields"):
        parse_nvidia_smi_csv("index, name\n0, x\n", ["name", "index"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(sorted(formats.GPU_FIELDS)), min_size=1, max_size=6, unique=True),
       st.integers(1, 8), st.booleans(), st.booleans(), st.integers(0, 81559))
def test_emulator_output_parses_back(fields, count, header, units, used):
    gpus = [formats.EmulatedGpu(i, memory_used_mib=used) for i in range(count)]
    text = formats.nvidia_smi_query(gpus, fields, 1_714_557_600_123_456_789, header=header, units=units)
    q = parse_nvidia_smi_csv(text, fields, header=header)
    assert len(q.rows) == count
    if "index" in fields:
        assert q.column("index") == list(range(count))
    if "memory.used" in fields:
        assert q.column("memory.used") == [used] * count
    if "memory.free" in fields:
        assert q.column("memory.free") == [81559 - used] * count
    if "fan.speed" in fields:
        assert q.column("fan.speed") == [None] * count


def test_topo_header_without_any_separator_is_refused_clearly():
    # a paste that lost every TAB of the header (`GPU0GPU1NIC0...`) cannot be split into columns
    text = "GPU0GPU1NIC0CPU Affinity\nGPU0     X     SYS    PHB    0-13    0\n"
    with pytest.raises(ParseError, match="header row"):
        parse_nvidia_smi_topo(text)


def test_table_refuses_a_driver_failure_message():
    with pytest.raises(ParseError, match="NVIDIA-SMI x  Driver Version"):
        parse_nvidia_smi_table("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                               "Make sure that the latest NVIDIA driver is installed and running.\n")
