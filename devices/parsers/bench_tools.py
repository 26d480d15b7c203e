"""Parsers for benchmark tool output: nccl-tests `alltoall_perf` and perftest `ib_write_bw`
(formats: spec protocols.md §3.2, §3.3). Pure functions: text in, records out."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from devices.parsers.common import ParseError


# ---- nccl-tests --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NcclPhase:
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None  # None when the test ran without checking (prints N/A) or printed a float error instead
    max_error: float | None = None  # nccl-tests before #wrong (~2020) printed the max error, e.g. 1e-07


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str  # '' where the table has no redop column (old all_gather tables)
    root: int | None  # None where the table has no root column (nccl-tests < 2.x of 2020)
    out_of_place: NcclPhase
    in_place: NcclPhase | None


@dataclass
class NcclResult:
    rows: list[NcclRow]
    avg_busbw_gbs: float | None = None
    out_of_bounds: int | None = None
    ranks: list[dict] = field(default_factory=list)  # rank, host, device
    settings: dict[str, str] = field(default_factory=dict)  # nThread, nGpus, minBytes, maxBytes, iters, ...
    version: str | None = None  # `# nccl-tests version 2.17.6 ...` (nccl-tests >= 2.17)
    collective: str | None = None  # `# Collective test starting: all_reduce_perf`


# `mpirun --tag-output` prefixes every line with `[JOB,RANK]<stdout>:`; launchers such as SkyPilot add their own
# prefix before it. Only stdout lines carry the table.
_TAG = re.compile(r"^.*?\[\d+,\d+\]<(stdout|stderr)>:")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)")
# The two summary lines, with their `#` as printed or without it as often pasted (the `#` turns a line into a
# Markdown heading, so posters drop it: real captures in tests/data/real/nccl-tests/).
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_SETTING = re.compile(r"\b(nThread|nGpus|minBytes|maxBytes|step|warmup iters|iters|agg iters|validation|graph|unalign):?"
                      r"\s+(\S+)")


def _float(token: str, line: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError("a number in an nccl-tests result row", line) from None


def _phase(tokens: list[str], line: str) -> NcclPhase:
    wrong_text = tokens[3]
    wrong, max_error = None, None
    if wrong_text.isdigit():
        wrong = int(wrong_text)
    elif wrong_text != "N/A":
        max_error = _float(wrong_text, line)
    return NcclPhase(_float(tokens[0], line), _float(tokens[1], line), _float(tokens[2], line), wrong, max_error)


def _untag(line: str) -> str | None:
    """The line without an mpirun tag; None for a tagged stderr line."""
    m = _TAG.match(line)
    if not m:
        return line
    return None if m.group(1) == "stderr" else line[m.end():]


def parse_nccl_tests(text: str) -> NcclResult:
    """Parse any nccl-tests collective's output (`alltoall_perf`, `all_reduce_perf`, ...): every table layout
    since 2019 — size count type [redop [root]] then one or two phases of time algbw busbw #wrong|error —
    with or without `mpirun --tag-output` prefixes; the summary lines with or without their `#` (a paste that
    kept only the summary gives no rows). Raises ParseError with neither a result row nor a summary."""
    result = NcclResult(rows=[])
    for raw in text.splitlines():
        line = _untag(raw)
        if line is None:
            continue
        stripped = line.strip()
        if not stripped:
            continue
        if m := _AVG.match(stripped):
            result.avg_busbw_gbs = _float(m.group(1), line)
            continue
        if m := _OOB.match(stripped):
            result.out_of_bounds = int(m.group(1))
            continue
        if stripped.startswith("#"):
            if m := _RANK.match(stripped):
                result.ranks.append({"rank": int(m.group(1)), "host": m.group(2), "device": int(m.group(3))})
            elif m := _VERSION.match(stripped):
                result.version = m.group(1)
            elif m := _STARTING.match(stripped):
                result.collective = m.group(1)
            elif stripped.startswith("# nThread"):
                result.settings.update(_SETTING.findall(stripped))
            continue
        tokens = stripped.split()
        if not tokens[0].isdigit():
            continue  # NCCL INFO/WARN lines and `NCCL version` between the rank list and the rows
        extra, phases = (len(tokens) - 3) % 4, (len(tokens) - 3) // 4
        if len(tokens) < 7 or phases not in (1, 2) or extra > 2 or tokens[2][0].isdigit():
            raise ParseError("an nccl-tests row: size count type [redop [root]] then 4 or 8 numbers", line)
        try:
            size, count = int(tokens[0]), int(tokens[1])
            root = int(tokens[4]) if extra == 2 else None
        except ValueError:
            raise ParseError("integer size, count and root in an nccl-tests row", line) from None
        first = 3 + extra
        in_place = _phase(tokens[first + 4:first + 8], line) if phases == 2 else None
        result.rows.append(NcclRow(size, count, tokens[2], tokens[3] if extra else "", root,
                                   _phase(tokens[first:first + 4], line), in_place))
    if not result.rows and result.avg_busbw_gbs is None:
        raise ParseError("at least one nccl-tests result row or an 'Avg bus bandwidth' line", text[:120])
    return result


# ---- perftest ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PerftestRow:
    size_bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float
    unit: str  # as printed: MiB/sec, MB/sec or Gb/sec

    @property
    def bw_average_gbps(self) -> float:
        return self.bw_average * _TO_GBPS[self.unit]

    @property
    def bw_peak_gbps(self) -> float:
        return self.bw_peak * _TO_GBPS[self.unit]


# perftest divides by 2^20 for both labels (it renamed MB to MiB without changing the arithmetic).
_TO_GBPS = {"MiB/sec": 2**20 * 8 / 1e9, "MB/sec": 2**20 * 8 / 1e9, "Gb/sec": 1.0}


@dataclass
class PerftestResult:
    rows: list[PerftestRow]
    unit: str
    settings: dict[str, str] = field(default_factory=dict)  # Device, Link type, Mtu, Connection type, ...
    local: dict[str, str] = field(default_factory=dict)  # LID, QPN, PSN, RKey, VAddr, GID
    remote: dict[str, str] = field(default_factory=dict)


_UNIT = re.compile(r"BW peak\[([^\]]+)\]")
_ADDRESS = re.compile(r"^\s*(local|remote) address:\s*(.*)$")
_GID = re.compile(r"^\s*GID:\s*(\S+)")
# Settings come two per line, normally separated by TABs (` Dual-port       : OFF\t\tDevice         : mlx5_0`);
# pasted output often has the TABs as spaces. A new setting starts where a run of TABs or of 3+ spaces is
# followed by `Key :` — the padding before a key's own colon is never followed by a letter.
_SETTING_BREAK = re.compile(r"(?<=\S)(?:\t+| {3,})(?=[A-Za-z][^:\t]*:)")


@dataclass
class PerftestHeader:
    """What perftest prints before its result table."""

    test: str | None  # `RDMA_Write BW Test`, `RDMA_Write Bidirectional BW Test`, ...
    settings: dict[str, str]
    local: list[dict[str, str]]  # one per QP: LID, QPN, PSN[, RKey, VAddr][, GID]
    remote: list[dict[str, str]]
    unit: str | None  # None when the table header is not in the text


def parse_perftest_header(text: str) -> PerftestHeader:
    """The settings block, the address lines and the table's bandwidth unit of a perftest bandwidth tool."""
    header = PerftestHeader(None, {}, [], [], None)
    last: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if m := _UNIT.search(line):
            if m.group(1) not in _TO_GBPS:
                raise ParseError("bandwidth unit MiB/sec, MB/sec or Gb/sec", line)
            header.unit = m.group(1)
            break
        if m := _ADDRESS.match(line):
            words = m.group(2).split()
            last = dict(zip(words[0::2], words[1::2]))
            (header.local if m.group(1) == "local" else header.remote).append(last)
            continue
        if (m := _GID.match(line)) and last is not None:
            last["GID"] = m.group(1)
            continue
        if stripped.endswith(" Test") and ":" not in stripped:
            header.test = stripped
            continue
        if ":" in line and not stripped.startswith(("-", "*")):
            for part in _SETTING_BREAK.split(line):
                key, sep, value = part.partition(":")
                if sep and key.strip() and value.strip():
                    header.settings[key.strip()] = value.strip()
    return header


def parse_ib_write_bw(text: str) -> PerftestResult:
    """Parse `ib_write_bw` (and the other perftest bandwidth tools') output, header and result rows."""
    header = parse_perftest_header(text)
    if header.unit is None:
        raise ParseError("a perftest header with 'BW peak[unit]'", text[:120])
    rows = []
    in_table = False
    for line in text.splitlines():
        if _UNIT.search(line):
            in_table = True
            continue
        stripped = line.strip()
        if in_table and stripped and stripped[0].isdigit():
            tokens = stripped.split()
            if len(tokens) != 5:
                raise ParseError("a perftest row: #bytes #iterations BW-peak BW-average MsgRate", line)
            try:
                rows.append(PerftestRow(int(tokens[0]), int(tokens[1]), float(tokens[2]), float(tokens[3]),
                                        float(tokens[4]), header.unit))
            except ValueError:
                raise ParseError("a perftest row of numbers", line) from None
    if not rows:
        raise ParseError("at least one perftest result row", text[-120:])
    return PerftestResult(rows, header.unit, header.settings, header.local[0] if header.local else {},
                          header.remote[0] if header.remote else {})
