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
    wrong: int | None  # None when the test ran without checking (prints N/A)


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: NcclPhase
    in_place: NcclPhase | None


@dataclass
class NcclResult:
    rows: list[NcclRow]
    avg_busbw_gbs: float | None = None
    out_of_bounds: int | None = None
    ranks: list[dict] = field(default_factory=list)  # rank, host, device
    settings: dict[str, str] = field(default_factory=dict)  # nThread, nGpus, minBytes, maxBytes, iters, ...


_RANK = re.compile(r"^#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_SETTING = re.compile(r"\b(nThread|nGpus|minBytes|maxBytes|step|warmup iters|iters|agg iters|validation|graph):?"
                      r"\s+(\S+)")


def _float(token: str, line: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError("a number in an nccl-tests result row", line) from None


def _phase(tokens: list[str], line: str) -> NcclPhase:
    wrong = None if tokens[3] == "N/A" else int(_float(tokens[3], line))
    return NcclPhase(_float(tokens[0], line), _float(tokens[1], line), _float(tokens[2], line), wrong)


def parse_nccl_tests(text: str) -> NcclResult:
    """Parse `alltoall_perf` (or any nccl-tests collective) output. Raises ParseError if no result row."""
    result = NcclResult(rows=[])
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if m := _RANK.match(stripped):
                result.ranks.append({"rank": int(m.group(1)), "host": m.group(2), "device": int(m.group(3))})
            elif m := _AVG.match(stripped):
                result.avg_busbw_gbs = _float(m.group(1), line)
            elif m := _OOB.match(stripped):
                result.out_of_bounds = int(m.group(1))
            elif stripped.startswith("# nThread"):
                result.settings.update(_SETTING.findall(stripped))
            continue
        tokens = stripped.split()
        if len(tokens) not in (9, 13):
            # nccl-tests also prints warnings/NCCL INFO lines between rows; only numeric rows matter.
            if tokens[0].isdigit():
                raise ParseError("an nccl-tests row of 9 or 13 columns", line)
            continue
        try:
            size, count, root = int(tokens[0]), int(tokens[1]), int(tokens[4])
        except ValueError:
            continue
        in_place = _phase(tokens[9:13], line) if len(tokens) == 13 else None
        result.rows.append(NcclRow(size, count, tokens[2], tokens[3], root, _phase(tokens[5:9], line), in_place))
    if not result.rows:
        raise ParseError("at least one nccl-tests result row", text[:120])
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


def parse_ib_write_bw(text: str) -> PerftestResult:
    """Parse `ib_write_bw` (and the other perftest bandwidth tools') output."""
    unit, rows, settings = None, [], {}
    local: dict[str, str] = {}
    remote: dict[str, str] = {}
    last_address: dict[str, str] | None = None
    for line in text.splitlines():
        if m := _UNIT.search(line):
            unit = m.group(1)
            if unit not in _TO_GBPS:
                raise ParseError("bandwidth unit MiB/sec, MB/sec or Gb/sec", line)
            continue
        if m := _ADDRESS.match(line):
            target = local if m.group(1) == "local" else remote
            words = m.group(2).split()
            target.update(zip(words[0::2], words[1::2]))
            last_address = target
            continue
        if (m := _GID.match(line)) and last_address is not None:
            last_address["GID"] = m.group(1)
            continue
        stripped = line.strip()
        if unit is not None and stripped and stripped[0].isdigit():
            tokens = stripped.split()
            if len(tokens) != 5:
                raise ParseError("a perftest row: #bytes #iterations BW-peak BW-average MsgRate", line)
            try:
                rows.append(PerftestRow(int(tokens[0]), int(tokens[1]), float(tokens[2]), float(tokens[3]),
                                        float(tokens[4]), unit))
            except ValueError:
                raise ParseError("a perftest row of numbers", line) from None
            continue
        if unit is None and ":" in line and not stripped.startswith("-"):
            # Settings come two per line, separated by tabs: ` Dual-port : OFF\t\tDevice : mlx5_0`.
            for part in re.split(r"\t+", line):
                key, sep, value = part.partition(":")
                if sep and key.strip() and value.strip():
                    settings[key.strip()] = value.strip()
    if unit is None:
        raise ParseError("a perftest header with 'BW peak[unit]'", text[:120])
    if not rows:
        raise ParseError("at least one perftest result row", text[-120:])
    return PerftestResult(rows, unit, settings, local, remote)
