"""Parsers of host clock tools: `date +%s.%N`, `chronyc tracking` (both forms, spec protocols.md §4), linuxptp's
`pmc` management replies and ptp4l's offset lines, and the offset bounds they give (clock sources a lab runs)."""
from __future__ import annotations

import calendar
import re
import time
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
    ("fast"); `frequency_ppm` and `residual_freq_ppm` > 0 when the clock runs fast. `ref_time_s`: Unix time of
    chrony's last clock update."""

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
    ref_time_s: float | None = None

    def error_bound_s(self, at_s: float, max_clock_error_ppm: float = 1.0) -> float:
        """AWS ClockBound's clock error bound at host Unix time `at_s`: |System time| + root dispersion + root
        delay / 2, the dispersion grown since the last update at (max clock error + skew + |residual freq|)
        ppm (clock-bound-d `dispersion_at`; it adds the residual signed, its magnitude is the safe side)."""
        return abs(self.system_time_s) + self.correction_bound_s(at_s, max_clock_error_ppm)

    def correction_bound_s(self, at_s: float, max_clock_error_ppm: float = 1.0) -> float:
        """How far the host clock minus `system_time_s` may be from the reference: the error bound without the
        offset chrony knows of and has not yet slewed away."""
        age = max(0.0, at_s - self.ref_time_s) if self.ref_time_s is not None else self.update_interval_s
        rate = (max_clock_error_ppm + self.skew_ppm + abs(self.residual_freq_ppm)) * 1e-6
        return self.root_dispersion_s + age * rate + self.root_delay_s / 2


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
    ref_time = None
    if "Ref time (UTC)" in fields:
        try:  # client.c's %T: asctime-like in UTC
            ref_time = float(calendar.timegm(time.strptime(fields["Ref time (UTC)"], "%a %b %d %H:%M:%S %Y")))
        except ValueError:
            raise ParseError("'Ref time (UTC) : Www Mmm dd hh:mm:ss yyyy'", fields["Ref time (UTC)"]) from None
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
        update_interval_s=float(interval.group(1)), leap_status=fields["Leap status"], ref_time_s=ref_time)


_CSV_FIELDS = ("reference id", "reference name", "stratum", "ref time", "system time", "last offset", "rms offset",
               "frequency", "residual freq", "skew", "root delay", "root dispersion", "update interval",
               "leap status")


def parse_chronyc_tracking_csv(text: str) -> ChronyTracking:
    """`chronyc -c tracking`: one line of 14 fields in the order of client.c's report. CSV prints the raw signed
    values: System time is chrony's correction (> 0: the clock is slow, so the sign flips to ours), Frequency
    > 0 is fast (as ours)."""
    line = single_line(text, "chronyc -c tracking")
    parts = line.split(",")
    if len(parts) != len(_CSV_FIELDS):
        raise ParseError(f"{len(_CSV_FIELDS)} comma-separated fields ({', '.join(_CSV_FIELDS)})", line)
    if not re.fullmatch(r"[0-9A-F]{8}", parts[0]) or not parts[2].isdigit():
        raise ParseError("'REFID,NAME,STRATUM,...' (8 hex digits, a name, an integer)", line)
    try:
        x = [float(v) for v in parts[3:13]]
    except ValueError:
        raise ParseError("numbers in fields 4-13 of chronyc -c tracking", line) from None
    return ChronyTracking(
        reference_id=parts[0], reference_name=parts[1], stratum=int(parts[2]), ref_time_s=x[0],
        system_time_s=-x[1], last_offset_s=x[2], rms_offset_s=x[3], frequency_ppm=x[4], residual_freq_ppm=x[5],
        skew_ppm=x[6], root_delay_s=x[7], root_dispersion_s=x[8], update_interval_s=x[9], leap_status=parts[13])


# ---------------------------------------------------------------- linuxptp


@dataclass(frozen=True)
class PmcResponse:
    """One `RESPONSE MANAGEMENT <ID>` block of `pmc`: who answered and its `name value` lines."""

    port_identity: str
    management_id: str
    fields: dict[str, str]


_PMC_HEAD = re.compile(r"([0-9a-f]{6}\.[0-9a-f]{4}\.[0-9a-f]{6}-\d+) seq \d+ RESPONSE MANAGEMENT (\w+)")


def parse_pmc(text: str) -> list[PmcResponse]:
    """Every response block of `pmc` output (linuxptp pmc_common.c: a tab-indented head, then tab-indented
    `name value` lines); `sending:` echoes and blank lines are skipped. No block: [] (nobody answered)."""
    out: list[PmcResponse] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("sending:"):
            continue
        head = _PMC_HEAD.fullmatch(line)
        if head:
            out.append(PmcResponse(head.group(1), head.group(2), {}))
            continue
        name, _, value = line.partition(" ")
        if not out or not value.strip():
            raise ParseError("pmc 'ID seq N RESPONSE MANAGEMENT X' blocks of 'name value' lines", raw)
        out[-1].fields[name] = value.strip()
    return out


@dataclass(frozen=True)
class PtpStatus:
    """What ptp4l's own clock knows of its grandmaster: `master_offset_ns` = this clock minus the master's at
    `ingress_time_ns` (this clock's time of the last sync), `mean_path_delay_ns` when CURRENT_DATA_SET came too."""

    master_offset_ns: int
    ingress_time_ns: int
    gm_present: bool
    gm_identity: str
    mean_path_delay_ns: float | None = None
    steps_removed: int | None = None

    @property
    def synced(self) -> bool:
        """A master is present and a sync has been taken (ingress 0: none yet, or this clock is the master)."""
        return self.gm_present and self.ingress_time_ns > 0

    def offset_bound_ns(self, at_ns: int, max_drift_ppm: float = 1.0) -> float:
        """Half-width around `master_offset_ns` holding this clock minus the master's at host time `at_ns`, from
        this sync alone. ptp4l's offset is the sync's own t2 - t1 less its filtered mean path delay D (a moving
        median of round trips / 2), so it errs by that sync's master-to-slave delay d less D: never below -D
        (d >= 0), and at most D while d <= 2D, i.e. the sync was no slower than the median round trip (a sync
        delayed beyond that, as on a loaded machine, errs by more: `ptp_offset_bound` reads several syncs and
        carries their spread). Grown since the sync at `max_drift_ppm` (ClockBound's default max clock error,
        1 ppm)."""
        if self.mean_path_delay_ns is None:
            raise ValueError("no mean path delay: ask pmc for CURRENT_DATA_SET too")
        age = max(0, at_ns - self.ingress_time_ns)
        return abs(self.mean_path_delay_ns) + age * max_drift_ppm * 1e-6


def ptp_offset_bound(statuses: list[PtpStatus], at_ns: int, max_drift_ppm: float = 1.0) -> tuple[PtpStatus, float]:
    """The sync read (synced, with a path delay) whose offset is bounded most tightly at host time `at_ns`, and
    that half-width. Each sync k's t2 - t1 is r_k = offset_k + D_k; between syncs k and j the clocks move apart
    by at most `max_drift_ppm` of the time between them, so sync k's delay exceeds the least-delayed one's by at
    most S_k = max_j (r_k - r_j + drift * |t_k - t_j|). Sync k's offset then errs by at most D_k + S_k, provided
    the least-delayed of the syncs read was no slower than twice the path delay (the median round trip) — an
    assumption about the fastest of several syncs, not about each (`PtpStatus.offset_bound_ns`)."""
    syncs = list({s.ingress_time_ns: s for s in statuses if s.synced and s.mean_path_delay_ns is not None}.values())
    if not syncs:
        raise ValueError("no sync with a path delay among the statuses")
    rate = max_drift_ppm * 1e-6

    def width(k: PtpStatus) -> float:
        r_k = k.master_offset_ns + k.mean_path_delay_ns
        spread = max(r_k - (j.master_offset_ns + j.mean_path_delay_ns)
                     + rate * abs(k.ingress_time_ns - j.ingress_time_ns) for j in syncs)
        return k.offset_bound_ns(at_ns, max_drift_ppm) + max(spread, 0.0)

    best = min(syncs, key=width)
    return best, width(best)


def ptp_status(responses: list[PmcResponse]) -> PtpStatus | None:
    """The first TIME_STATUS_NP response (with `-b 0` the local ptp4l answers first), with the first
    CURRENT_DATA_SET's path delay if present; None when no ptp4l answered."""
    ts = next((r for r in responses if r.management_id == "TIME_STATUS_NP"), None)
    if ts is None:
        return None
    cds = next((r for r in responses if r.management_id == "CURRENT_DATA_SET"), None)
    try:
        f = ts.fields
        gm = f["gmPresent"]
        if gm not in ("true", "false"):
            raise ValueError(gm)
        return PtpStatus(master_offset_ns=int(f["master_offset"]), ingress_time_ns=int(f["ingress_time"]),
                         gm_present=gm == "true", gm_identity=f["gmIdentity"],
                         mean_path_delay_ns=float(cds.fields["meanPathDelay"]) if cds else None,
                         steps_removed=int(cds.fields["stepsRemoved"]) if cds else None)
    except (KeyError, ValueError):
        raise ParseError("TIME_STATUS_NP with integer master_offset and ingress_time, gmPresent true|false, "
                         "gmIdentity (and CURRENT_DATA_SET meanPathDelay, stepsRemoved)",
                         " ".join(f"{k}={v}" for k, v in ts.fields.items())) from None


@dataclass(frozen=True)
class Ptp4lOffset:
    """One ptp4l offset line. `kind` 'sync': `offset_ns` is that sync's master offset and `state` the servo state
    (s0 unlocked, s1 stepped, s2 locked); 'summary': `offset_ns` is the rms and `max_abs_ns` the largest |offset|
    over the summary interval. `path_delay_ns` None when ptp4l printed none. `t_s`: the log's monotonic stamp."""

    t_s: float
    kind: str
    offset_ns: int
    max_abs_ns: int
    path_delay_ns: int | None
    freq_ppb: int
    state: str = ""

    @property
    def bound_ns(self) -> int | None:
        """|this clock minus the master's| over the line's interval: the largest offset plus the path delay (the
        delay request-response bound of `PtpStatus.offset_bound_ns`); None without a delay."""
        return None if self.path_delay_ns is None else self.max_abs_ns + abs(self.path_delay_ns)


# `ptp4l[MONO]: ` on stdout, `ptp4l[PID]: [MONO] ` through syslog; then an optional `[message_tag] `
_PTP4L_STAMP = re.compile(r"ptp4l\[(?:(\d+\.\d+)\]:|\d+\]: \[(\d+\.\d+)\]) (?:\[[^\]]*\] )?")
_PTP4L_SYNC = re.compile(r"master offset\s+(-?\d+) (s\d) freq\s+([-+]?\d+)(?: path delay\s+(-?\d+))?")
_PTP4L_SUMMARY = re.compile(r"rms\s+(\d+) max\s+(\d+) freq\s+([-+]?\d+) \+/-\s+\d+(?: delay\s+(-?\d+) \+/-\s+\d+)?")


def parse_ptp4l_line(line: str) -> Ptp4lOffset | None:
    """A ptp4l offset line (clock.c: one per sync, or the rms/max summary when syncs come faster than the
    summary interval); None for ptp4l's other lines (port state changes, ...) and for other programs' lines."""
    stamp = _PTP4L_STAMP.search(line)
    if stamp is None:
        return None
    t_s = float(stamp.group(1) or stamp.group(2))
    text = line[stamp.end():].rstrip()
    m = _PTP4L_SYNC.fullmatch(text)
    if m:
        offset = int(m.group(1))
        return Ptp4lOffset(t_s=t_s, kind="sync", offset_ns=offset, max_abs_ns=abs(offset),
                           path_delay_ns=None if m.group(4) is None else int(m.group(4)), freq_ppb=int(m.group(3)),
                           state=m.group(2))
    m = _PTP4L_SUMMARY.fullmatch(text)
    if m:
        return Ptp4lOffset(t_s=t_s, kind="summary", offset_ns=int(m.group(1)), max_abs_ns=int(m.group(2)),
                           path_delay_ns=None if m.group(4) is None else int(m.group(4)), freq_ppb=int(m.group(3)))
    if text.startswith(("master offset", "rms ")):
        raise ParseError("'master offset N sK freq F [path delay D]' or 'rms R max M freq F +/- S [delay D +/- S]'",
                         line)
    return None
