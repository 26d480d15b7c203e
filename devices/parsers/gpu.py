"""Parser of `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]` (spec protocols.md §3.1)."""
from __future__ import annotations

import calendar
import csv
import re
from dataclasses import dataclass

from devices.parsers.common import ParseError

GpuValue = int | float | str | None  # None for [N/A], [Not Supported], [Requested functionality has been deprecated]

# nvidia-smi accepts two names for some fields and prints the first in the CSV header ("clocks.sm" is queried,
# "clocks.current.sm [MHz]" comes back). From `nvidia-smi --help-query-gpu` (driver 590; real lines in
# tests/data/real/nvidia-smi/): alias -> the name the header prints.
FIELD_ALIASES = {
    "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics", "clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video", "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory", "gpu.power.requested_limit": "power.limit",
    "gpu.power.current_limit": "enforced.power.limit", "gpu.power.default_limit": "power.default_limit",
    "gpu.power.draw.average": "power.draw.average", "gpu.power.draw.instant": "power.draw.instant",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count", "retired_pages.dbe": "retired_pages.double_bit.count",
    "gpu_operation_mode.current": "gom.current", "gpu_operation_mode.pending": "gom.pending",
}


def canonical_field(name: str) -> str:
    """The name nvidia-smi prints in the CSV header for a queried field."""
    return FIELD_ALIASES.get(name, name)


# nvidia-smi puts every value it cannot give in brackets: [N/A], [Not Supported], [Unknown Error], and since driver
# 590 [Requested functionality has been deprecated] (real captures in tests/data/real/nvidia-smi/).
_NOT_AVAILABLE = ("N/A",)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_HEADER_FIELD = re.compile(r"([^\[\]]+?)(?: \[([^\]]+)\])?")


@dataclass(frozen=True)
class GpuQuery:
    """Rows of a `--query-gpu` answer. `fields` as queried; `units` from the header (None if unitless
    or not printed); each row holds typed values (numbers without their unit, None when unsupported)."""

    fields: tuple[str, ...]
    units: tuple[str | None, ...]
    rows: tuple[tuple[GpuValue, ...], ...]

    def records(self) -> list[dict[str, GpuValue]]:
        return [dict(zip(self.fields, row)) for row in self.rows]

    def column(self, field: str) -> list[GpuValue]:
        i = self.fields.index(canonical_field(field))
        return [row[i] for row in self.rows]


# Fields whose values are identifiers, never numbers: driver "595.80" must not become 595.8.
_TEXT_FIELDS = ("driver_version", "vbios_version", "inforom.", "pci.", "uuid", "serial", "name", "compute_cap",
                "timestamp", "platform.", "fabric.", "hostname", "gpu_name", "gpu_uuid", "gpu_serial", "gpu_bus_id")


def cell_value(raw: str, unit: str | None, field: str = "") -> GpuValue:
    """One CSV cell as its typed value (`field`: its canonical name, `unit` from the header or None)."""
    text = raw.strip()
    if text in _NOT_AVAILABLE or (text.startswith("[") and text.endswith("]")):
        return None
    if field.startswith(_TEXT_FIELDS):
        return text
    if unit and text.endswith(" " + unit):
        text = text[: -len(unit) - 1]
    elif not unit:
        # `nounits` plus `noheader`: the unit is unknown, but a lone trailing unit word still goes
        number, _, tail = text.partition(" ")
        if _NUMBER.fullmatch(number) and tail in ("MiB", "%", "W", "MHz", "C"):
            text = number
    if _NUMBER.fullmatch(text):
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    return text


def parse_nvidia_smi_csv(text: str, fields: list[str] | tuple[str, ...] | None = None, *,
                         header: bool = True) -> GpuQuery:
    """Parse the CSV answer. With `header=False` (`noheader`), pass the queried `fields` (their order is
    the column order); with a header, `fields` (if given) must match it."""
    lines = [line for line in text.splitlines() if line.strip()]
    units: list[str | None]
    if header:
        if not lines:
            raise ParseError("a CSV header 'field [unit], ...' (nvidia-smi)", text)
        names, units = [], []
        for cell in lines[0].split(", "):
            m = _HEADER_FIELD.fullmatch(cell.strip())
            if not m:
                raise ParseError("a header cell 'field' or 'field [unit]'", cell)
            names.append(m.group(1))
            units.append(m.group(2))
        if fields is not None and [canonical_field(f) for f in fields] != names:
            raise ParseError(f"header fields {list(fields)}", lines[0])
        lines = lines[1:]
    else:
        if not fields:
            raise ParseError("the queried field list (needed with noheader)", text)
        names, units = [canonical_field(f) for f in fields], [None] * len(fields)
    rows = []
    for line in lines:
        cells = next(csv.reader([line], skipinitialspace=True))
        if len(cells) != len(names):
            raise ParseError(f"{len(names)} comma-separated values ({', '.join(names)})", line)
        rows.append(tuple(cell_value(cell, unit, name) for cell, unit, name in zip(cells, units, names)))
    return GpuQuery(tuple(names), tuple(units), tuple(rows))


@dataclass(frozen=True)
class GpuTopology:
    """`nvidia-smi topo -m`: the link of every GPU to every other device (`X`, `NV#`, `PIX`, `PXB`, `PHB`,
    `NODE`, `SYS`), the NIC legend (`NIC0` -> `mlx5_0`) and each GPU's CPU / NUMA affinity."""

    links: dict[str, dict[str, str]]  # row device -> column device -> link, for GPU rows
    nic_names: dict[str, str]  # "NIC0" -> "mlx5_0" (older drivers label columns with the device name itself)
    cpu_affinity: dict[str, str]
    numa_affinity: dict[str, str]

    def closest_gpus(self, nic: str) -> list[str]:
        """GPUs with the nearest PCIe path to RDMA device `nic` (PIX < PXB < PHB < NODE < SYS)."""
        label = next((k for k, v in self.nic_names.items() if v == nic), nic)
        ranked = [(_LINK_RANK.get(row.get(label, "SYS"), len(_LINK_RANK)), gpu) for gpu, row in self.links.items()
                  if label in row]
        best = min((rank for rank, _ in ranked), default=None)
        return [gpu for rank, gpu in ranked if rank == best]


_LINK_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Cells are TAB-separated as printed; pasted copies often carry the TABs as runs of spaces. A run of two or more
# spaces never occurs inside a cell ("CPU Affinity" has one), so both read the same.
_CELL_BREAK = re.compile(r"\t+| {2,}")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_BREAK.split(line.strip()) if c.strip()]


def parse_nvidia_smi_topo(text: str) -> GpuTopology:
    """`nvidia-smi topo -m`: a tab-separated matrix (the header row underlined with ANSI escapes on a
    terminal; TABs pasted as spaces read the same), then `Legend:` and, with NICs, `NIC Legend:` lines
    `  NIC0: mlx5_0`."""
    lines = _ANSI.sub("", text).splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]
                      and not line.startswith("GPU0")), None)
    if header_at is None:
        raise ParseError("a header row '\\tGPU0\\tGPU1...' (nvidia-smi topo -m)", text)
    columns = _cells(lines[header_at])
    devices = [c for c in columns if re.fullmatch(r"GPU\d+|NIC\d+|mlx\d+_\d+|\w+_\d+", c)]
    links: dict[str, dict[str, str]] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, str] = {}
    for line in lines[header_at + 1:]:
        if not line.strip():
            break
        cells = _cells(line)
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        values = cells[1:]
        if len(values) < len(devices):
            raise ParseError(f"{len(devices)} link cells in the row of {cells[0]}", line)
        links[cells[0]] = dict(zip(devices, values[:len(devices)]))
        rest = dict(zip(columns[len(devices):], values[len(devices):]))
        cpu[cells[0]] = rest.get("CPU Affinity", "")
        numa[cells[0]] = rest.get("NUMA Affinity", "")
    if not links:
        raise ParseError("GPU rows under the header (nvidia-smi topo -m)", text)
    nic_names = {m.group(1): m.group(2) for m in (re.fullmatch(r"\s+(NIC\d+): (\S+)", line) for line in lines) if m}
    return GpuTopology(links, nic_names, cpu, numa)


_TIMESTAMP = re.compile(r"(\d{4})/(\d{2})/(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{3})")


def parse_nvidia_timestamp(text: str) -> int:
    """The `timestamp` query field, "YYYY/MM/DD HH:MM:SS.mmm" (when the query was made, the host's local time,
    no zone, milliseconds: `nvidia-smi --help-query-gpu`), as ns since the epoch read as if it were UTC — the
    reader knows the host's zone offset (a multiple of 15 minutes), the text does not."""
    m = _TIMESTAMP.fullmatch(text.strip())
    if not m:
        raise ParseError("a timestamp 'YYYY/MM/DD HH:MM:SS.mmm' (nvidia-smi)", text)
    y, mo, d, h, mi, s, ms = (int(g) for g in m.groups())
    try:
        seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except ValueError:  # a month outside 1-12, or year 0
        raise ParseError("a timestamp 'YYYY/MM/DD HH:MM:SS.mmm' with a month 1-12 (nvidia-smi)", text) from None
    return (seconds * 1000 + ms) * 1_000_000


# ---- the default `nvidia-smi` table ------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuTableRow:
    """One GPU of the default `nvidia-smi` table (its three lines), values as printed (None for N/A)."""

    index: int
    name: str  # truncated by nvidia-smi when long: "NVIDIA GeForce RTX 4080 ..."
    persistence: str  # Persistence-M: On / Off; on Windows the Driver-Model column: WDDM / TCC
    bus_id: str  # "00000000:19:00.0", as the CSV's pci.bus_id
    display_active: str
    ecc: str | None  # "Volatile Uncorr. ECC": a count, On (MIG), or None
    fan_pct: int | None
    temp_c: int | None
    perf: str | None
    power_w: int | None
    power_cap_w: int | None
    memory_used_mib: int
    memory_total_mib: int
    util_pct: int | None  # None in MIG mode (N/A)
    compute_mode: str
    mig_mode: str | None


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    gi: str | None
    ci: str | None
    pid: int
    kind: str  # C, G, C+G
    name: str
    memory_mib: int | None


@dataclass(frozen=True)
class NvidiaSmiTable:
    driver_version: str
    cuda_version: str | None
    gpus: tuple[GpuTableRow, ...]
    processes: tuple[GpuProcess, ...]


_SMI_HEAD = re.compile(r"\|\s*NVIDIA-SMI (\S+)\s+Driver Version: (\S+)\s+CUDA Version: (\S+)")
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
_GPU_LINE1 = re.compile(rf"\|\s*(\d+)\s+(.+?)\s+(\S+)\s*\|\s*({_BUS_ID.pattern})\s+(\S+)\s*\|\s*(.*?)\s*\|")
_GPU_LINE2 = re.compile(r"\|\s*(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*/\s*(\S+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|"
                        r"\s*(\S+)\s+(.+?)\s*\|")
_PROCESS = re.compile(r"\|\s*(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(C\+G|C|G)\s+(.*?)\s+(\d+MiB|N/A)\s*\|")


def _number(text: str, suffix: str) -> int | None:
    m = re.fullmatch(rf"(\d+){re.escape(suffix)}", text)
    return int(m.group(1)) if m else None


def parse_nvidia_smi_table(text: str) -> NvidiaSmiTable:
    """The default `nvidia-smi` output (no options): the header with driver and CUDA versions, three lines per
    GPU (79-column layout before driver 530, 89 after), the MIG devices table (skipped) and the process table.
    Raises ParseError when the text has no `NVIDIA-SMI ... Driver Version:` header (e.g. "NVIDIA-SMI has failed
    because it couldn't communicate with the NVIDIA driver")."""
    lines = text.splitlines()
    head = next((m for m in map(_SMI_HEAD.search, lines) if m), None)
    if head is None:
        raise ParseError("the '| NVIDIA-SMI x  Driver Version: y  CUDA Version: z |' header (nvidia-smi)", text)
    gpus, processes = [], []
    i = 0
    while i < len(lines):
        first = _GPU_LINE1.match(lines[i])
        second = _GPU_LINE2.match(lines[i + 1]) if first and i + 1 < len(lines) else None
        if first and second:
            index, name, persistence, bus_id, disp, ecc = first.groups()
            fan, temp, perf, power, cap, used, total, util, compute = second.groups()
            third = lines[i + 2].split("|") if i + 2 < len(lines) else []
            mig = third[3].strip() if len(third) > 4 and third[3].strip() else None
            gpus.append(GpuTableRow(int(index), name, persistence, bus_id, disp, None if ecc == "N/A" else ecc,
                                    _number(fan, "%"), _number(temp, "C"), None if perf == "N/A" else perf,
                                    _number(power, "W"), _number(cap, "W"), int(used), int(total),
                                    _number(util, "%"), compute, None if mig == "N/A" else mig))
            i += 3
            continue
        if m := _PROCESS.match(lines[i]):
            gpu, gi, ci, pid, kind, name, memory = m.groups()
            processes.append(GpuProcess(int(gpu), None if gi == "N/A" else gi, None if ci == "N/A" else ci, int(pid),
                                        kind, name, _number(memory, "MiB")))
        i += 1
    return NvidiaSmiTable(head.group(2), None if head.group(3) == "N/A" else head.group(3), tuple(gpus),
                          tuple(processes))
