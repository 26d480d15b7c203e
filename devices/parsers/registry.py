"""Tool parsers by name: the project's own and those a lab's package adds, one entry each.

`harness parse NAME FILE` reads a capture with any of them. A lab adds a parser for its own tool with one module
that calls `register_parser(ToolParser(...))`, loaded from its package's entry-point group `ocs_hil.parsers` or
an `imports:` list (devices/plugins.py); a name registered twice is refused.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from devices.plugins import GROUPS, PluginError, load_group


@dataclass(frozen=True)
class ToolParser:
    """name: what `harness parse` calls it; parse: "module:function", `function(text) -> value` (raises
    `devices.parsers.ParseError`, a ValueError, on text it cannot read); tool: the command line it reads."""

    name: str
    parse: str
    tool: str

    def load(self) -> Callable[[str], Any]:
        module, _, attribute = self.parse.partition(":")
        return getattr(importlib.import_module(module), attribute)


_PARSERS: dict[str, ToolParser] = {}
_plugin_problem: list[str] = []


def register_parser(parser: ToolParser) -> ToolParser:
    """Add a parser; a name already registered is refused (ValueError), never overwritten."""
    if parser.name in _PARSERS:
        raise ValueError(f"tool parser {parser.name!r} is already registered ({_PARSERS[parser.name].parse})")
    _PARSERS[parser.name] = parser
    return parser


def _with_plugins() -> None:
    try:
        load_group(GROUPS["parsers"])
    except PluginError as exc:
        _plugin_problem.append(str(exc))


def parser_names() -> tuple[str, ...]:
    _with_plugins()
    return tuple(_PARSERS)


def get_parser(name: str) -> ToolParser:
    """The parser called `name`; KeyError with the known names (and any plugin that failed to load)."""
    _with_plugins()
    try:
        return _PARSERS[name]
    except KeyError:
        raise KeyError(f"unknown tool parser {name!r} (known: {', '.join(_PARSERS)})"
                       + "".join(f"; {problem}" for problem in _plugin_problem)) from None


# ---- the project's own ----------------------------------------------------------------------------------------
for _name, _parse, _tool in (
        ("ethtool-module", "devices.parsers.nic:parse_ethtool_module", "ethtool -m DEV"),
        ("ethtool", "devices.parsers.nic:parse_ethtool", "ethtool DEV"),
        ("ethtool-json", "devices.parsers.nic:parse_ethtool_json", "ethtool --json DEV"),
        ("ethtool-priv-flags", "devices.parsers.nic:parse_ethtool_priv_flags", "ethtool --show-priv-flags DEV"),
        ("ip-link", "devices.parsers.nic:parse_ip_link", "ip link show"),
        ("ip-link-json", "devices.parsers.nic:parse_ip_link_json", "ip -j link show"),
        ("rdma-link", "devices.parsers.nic:parse_rdma_link", "rdma link show"),
        ("rdma-link-json", "devices.parsers.nic:parse_rdma_link_json", "rdma -j link show"),
        ("mlxlink", "devices.parsers.nic:parse_mlxlink", "mlxlink -d DEV"),
        ("nvidia-smi-topo", "devices.parsers.gpu:parse_nvidia_smi_topo", "nvidia-smi topo -m"),
        ("nvidia-smi-csv", "devices.parsers.gpu:parse_nvidia_smi_csv", "nvidia-smi --query-gpu=... --format=csv"),
        ("nvidia-smi", "devices.parsers.gpu:parse_nvidia_smi_table", "nvidia-smi (the default table)"),
        ("ibstat", "devices.parsers.ib_tools:parse_ibstat", "ibstat"),
        ("ibstatus", "devices.parsers.ib_tools:parse_ibstatus", "ibstatus"),
        ("ibv-devinfo", "devices.parsers.ib_tools:parse_ibv_devinfo", "ibv_devinfo"),
        ("ibdev2netdev", "devices.parsers.ib_tools:parse_ibdev2netdev", "ibdev2netdev"),
        ("chronyc-tracking", "devices.parsers.clock_tools:parse_chronyc_tracking", "chronyc tracking"),
        ("chronyc-tracking-csv", "devices.parsers.clock_tools:parse_chronyc_tracking_csv", "chronyc -c tracking"),
        ("pmc", "devices.parsers.clock_tools:parse_pmc", "pmc -u -b 0 'GET TIME_STATUS_NP'"),
        ("nccl-tests", "devices.parsers.bench_tools:parse_nccl_tests", "all_reduce_perf, alltoall_perf, ..."),
        ("ib-write-bw", "devices.parsers.bench_tools:parse_ib_write_bw", "ib_write_bw")):
    register_parser(ToolParser(_name, _parse, _tool))
