"""Parsers of host clock tools: `date +%s.%N` and `chronyc tracking` (spec protocols.md §4)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from devices.parsers.common import ParseError, single_line

_DATE_NS = re.compile(r"(\d+)\.(\d{9})")


def parse_date_ns(text: str) -> int:
    """`date +%s.%N` -> Unix time in integer ns (no float rounding)."""
    line = single_line(text, "date +%s.%N")
    m = _DATE_NS.fullmatch(line)
    if not m:
        raise ParseError("'<seconds>.<9 digits>' (date +%s.%N)", text)
    return int(m.group(1)) * 1_000_000_000 + int(m.group(2))


@dataclass(frozen=True)
class ChronyTracking:
    """`chronyc tracking`. Signs: `system_time_s` > 0 when the system clock is ahead of NTP time
    ("fast"); `frequency_ppm` and `residual_freq_ppm` > 0 when the clock runs fast."""

    reference_id: str
    reference_name: str
    stratum: int
    system_time_s: float
    last_offset_s: float
    rms_offset_s: float
    frequency_ppm: float
    residual_freq_ppm: float
    skew_ppm: float
    root_delay_s: float
    root_dispersion_s: float
    update_interval_s: float
    leap_status: str


def _seconds(value: str, key: str) -> float:
    m = re.fullmatch(r"([-+]?\d+(?:\.\d+)?) seconds(?: (fast|slow) of NTP time)?", value)
    if not m:
        raise ParseError(f"'{key}: <x> seconds [fast|slow of NTP time]'", value)
    x = float(m.group(1))
    return -x if m.group(2) == "slow" else x


def _ppm(value: str, key: str) -> float:
    m = re.fullmatch(r"([-+]?\d+(?:\.\d+)?) ppm(?: (fast|slow))?", value)
    if not m:
        raise ParseError(f"'{key}: <x> ppm [fast|slow]'", value)
    x = float(m.group(1))
    return -x if m.group(2) == "slow" else x


_KEYS = ("Reference ID", "Stratum", "System time", "Last offset", "RMS offset", "Frequency",
         "Residual freq", "Skew", "Root delay", "Root dispersion", "Update interval", "Leap status")


def parse_chronyc_tracking(text: str) -> ChronyTracking:
    """`Key<pad>: value` lines as chrony's client.c prints them."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if sep:
            fields[key.strip()] = value.strip()
    missing = [k for k in _KEYS if k not in fields]
    if missing:
        raise ParseError(f"chronyc tracking fields {missing}", text)
    ref = re.fullmatch(r"([0-9A-F]{8}) \((.*)\)", fields["Reference ID"])
    if not ref:
        raise ParseError("'Reference ID : XXXXXXXX (name)'", fields["Reference ID"])
    interval = re.fullmatch(r"(\d+(?:\.\d+)?) seconds", fields["Update interval"])
    if not interval or not fields["Stratum"].isdigit():
        raise ParseError("'Stratum : N' and 'Update interval : x seconds'", text)
    return ChronyTracking(
        reference_id=ref.group(1), reference_name=ref.group(2), stratum=int(fields["Stratum"]),
        system_time_s=_seconds(fields["System time"], "System time"),
        last_offset_s=_seconds(fields["Last offset"], "Last offset"),
        rms_offset_s=_seconds(fields["RMS offset"], "RMS offset"),
        frequency_ppm=_ppm(fields["Frequency"], "Frequency"),
        residual_freq_ppm=_ppm(fields["Residual freq"], "Residual freq"),
        skew_ppm=_ppm(fields["Skew"], "Skew"),
        root_delay_s=_seconds(fields["Root delay"], "Root delay"),
        root_dispersion_s=_seconds(fields["Root dispersion"], "Root dispersion"),
        update_interval_s=float(interval.group(1)), leap_status=fields["Leap status"])
