"""Device identity for the manifest, where the bench can tell: the OCS's own answer (TL1 `RTRV-NETYPE`,
SCPI `*IDN?`), per NIC port the firmware (`/sys/class/infiniband/<dev>/fw_ver`), the transceiver's
vendor, part number and serial (`ethtool -m`) and the link-up settings the NIC exposes (`ethtool`'s
auto-negotiation, which link training rides on, and the driver's private flags, where a driver puts its own
link-up behaviour), per host the GPU model and serial (`nvidia-smi`) and the Python its agent ran under (checked
at install, `agent_python`).

Read once, at the end of a run, over the connections the run already has (no new ones), every device at once
(harness.fanout); every probe is bounded and a device that cannot tell is recorded as such (`null` with the
reason), never fatal."""
from __future__ import annotations

import shlex
from typing import Any

from devices.errors import DeviceError
from devices.timing import Deadline
from harness.fanout import fan_out

GPU_FIELDS = ("name", "uuid", "driver_version")


class _Unreachable(Exception):
    """The host failed a probe over the wire (not a command exiting non-zero): it is asked nothing more."""


def _run(transport, command: str, deadline: Deadline) -> str | None:
    try:
        result = transport.run(command, deadline=Deadline(min(5.0, max(deadline.remaining(), 0.1))))
    except (DeviceError, OSError) as exc:
        raise _Unreachable(str(exc)[:200]) from None
    return result.stdout if result.exit_status == 0 else None


def _module_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def host_identity(session, ports, within_s: float = 10.0) -> dict[str, Any]:
    """NIC firmware and transceivers of the host's NIC ports, and its GPUs; a host gone from the wire (e.g. the
    one that broke the run) is recorded as such after its first probe, not waited on once per question."""
    agent = {"agent_python": session.agent.python_version}
    try:
        return {**_host_identity(session, ports, within_s), **agent}
    except _Unreachable as exc:
        return {"nics": None, "gpus": None, **agent, "error": str(exc)}


def _host_identity(session, ports, within_s: float) -> dict[str, Any]:
    from devices.parsers.common import ParseError
    from devices.parsers.gpu import parse_nvidia_smi_csv
    from devices.parsers.nic import parse_ethtool_module

    deadline = Deadline(within_s)
    transport = session.transport
    nics = {}
    for nic in ports:
        entry: dict[str, Any] = {"rdma_dev": nic.rdma_dev}
        if nic.rdma_dev:
            fw = _run(transport, f"cat /sys/class/infiniband/{shlex.quote(nic.rdma_dev)}/fw_ver", deadline)
            entry["firmware"] = fw.strip() if fw else None
        module = _run(transport, f"ethtool -m {shlex.quote(nic.netdev)}", deadline)
        try:
            if module is not None:
                parse_ethtool_module(module)  # a real module record, not an error text
                fields = _module_fields(module)
                entry["transceiver"] = {"vendor": fields.get("Vendor name"), "part": fields.get("Vendor PN"),
                                        "serial": fields.get("Vendor SN"), "revision": fields.get("Vendor rev")}
        except ParseError:
            pass
        entry.setdefault("transceiver", None)
        entry["link"] = _link_settings(transport, nic.netdev, deadline)
        nics[nic.netdev] = entry
    gpus = None
    text = _run(transport, f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader", deadline)
    if text is not None:
        try:
            gpus = [{k: (None if v is None else str(v)) for k, v in r.items()}
                    for r in parse_nvidia_smi_csv(text, GPU_FIELDS, header=False).records()]
        except (ParseError, ValueError):
            gpus = None
    return {"nics": nics, "gpus": gpus}


def _link_settings(transport, netdev: str, deadline: Deadline) -> dict[str, Any] | None:
    """{"autoneg": bool | None, "priv_flags": {name: bool} | None} in one exec; None if ethtool answers neither."""
    from devices.parsers.common import ParseError
    from devices.parsers.nic import parse_ethtool, parse_ethtool_priv_flags

    dev = shlex.quote(netdev)
    text = _run(transport, f"ethtool {dev}; echo '## priv-flags'; ethtool --show-priv-flags {dev}; true", deadline)
    settings, _, flags = (text or "").partition("## priv-flags\n")
    link: dict[str, Any] = {"autoneg": None, "priv_flags": None}
    for key, parse, part in (("autoneg", lambda t: parse_ethtool(t).autoneg, settings),
                             ("priv_flags", parse_ethtool_priv_flags, flags)):
        try:
            link[key] = parse(part) if part.strip() else None
        except ParseError:
            pass
    return link if any(v is not None for v in link.values()) else None


def device_identity(switches: dict, sessions: dict, nic_ports, not_asked: dict[str, str] | None = None
                    ) -> dict[str, Any]:
    """{"ocs": {name: identity | None}, "hosts": {host: {...}}} for what the run has open. A switch in
    `not_asked` (name → why: it stopped answering during the run) is recorded unknown without waiting on it."""
    def ask(name: str) -> tuple[str | None, str | None]:  # (identity, why not)
        if name in (not_asked or {}):
            return None, f"not asked: {not_asked[name]}"[:200]
        try:
            return switches[name].identify(), None
        except (DeviceError, OSError, NotImplementedError) as exc:
            return None, str(exc)[:200]

    ocs = {}
    for name, (answer, error) in zip(switches, fan_out(ask, switches, name="identity")):
        ocs[name] = answer
        if error is not None:
            ocs[f"{name}_error"] = error
    # every host at once (a bounded pool), each within its own bound; recorded in the order of `sessions`
    hosts = fan_out(lambda h: host_identity(sessions[h], [p for p in nic_ports if p.host == h]), sessions,
                    name="identity")
    return {"ocs": ocs, "hosts": dict(zip(sessions, hosts))}
