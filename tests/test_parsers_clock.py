"""Clock tool parsers: `date +%s.%N` (exact integer ns) and `chronyc tracking` (spec §4 sample, signs)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from devices.emulated import formats
from devices.parsers import ParseError
from devices.parsers.clock_tools import parse_chronyc_tracking, parse_date_ns

SPEC_TRACKING = """Reference ID    : C0A80101 (ntp1.example)
Stratum         : 3
Ref time (UTC)  : Thu May 01 10:00:00 2025
System time     : 0.000012345 seconds fast of NTP time
Last offset     : -0.000001234 seconds
RMS offset      : 0.000004567 seconds
Frequency       : 1.234 ppm slow
Residual freq   : +0.001 ppm
Skew            : 0.020 ppm
Root delay      : 0.000345678 seconds
Root dispersion : 0.000123456 seconds
Update interval : 64.2 seconds
Leap status     : Normal
"""


def test_chronyc_tracking_spec_sample():
    t = parse_chronyc_tracking(SPEC_TRACKING)
    assert (t.reference_id, t.reference_name, t.stratum, t.leap_status) == ("C0A80101", "ntp1.example", 3, "Normal")
    assert t.system_time_s == pytest.approx(12.345e-6)  # fast: ahead of NTP time
    assert t.last_offset_s == pytest.approx(-1.234e-6)
    assert t.frequency_ppm == pytest.approx(-1.234)  # slow
    assert t.residual_freq_ppm == pytest.approx(0.001)
    assert (t.root_delay_s, t.update_interval_s) == (pytest.approx(345.678e-6), 64.2)


@given(st.floats(-1, 1).filter(lambda x: abs(x) > 1e-9), st.floats(-500, 500).filter(lambda x: abs(x) > 1e-3))
def test_chronyc_signs_round_trip(offset_s, freq_ppm):
    t = parse_chronyc_tracking(formats.chronyc_tracking(offset_s, freq_ppm))
    assert t.system_time_s == pytest.approx(offset_s, abs=1e-9)
    assert t.frequency_ppm == pytest.approx(freq_ppm, abs=1e-3)


@given(st.integers(0, 4_000_000_000 * 10**9))
def test_date_ns_is_exact(host_ns):
    assert parse_date_ns(formats.date_ns(host_ns)) == host_ns


@pytest.mark.parametrize("text", ["1714557600.12345678\n", "1714557600\n", "abc.123456789", "1.000000001\n2.0"])
def test_date_rejects_other_shapes(text):
    with pytest.raises(ParseError, match="expected"):
        parse_date_ns(text)


def test_chronyc_missing_fields():
    with pytest.raises(ParseError, match="Leap status"):
        parse_chronyc_tracking(SPEC_TRACKING.replace("Leap status     : Normal\n", ""))
    with pytest.raises(ParseError, match="seconds"):
        parse_chronyc_tracking(SPEC_TRACKING.replace("0.000012345 seconds fast", "12 us fast"))
