"""`harness ocs`: talk to one optical circuit switch (any protocol in the OCS registry) from the command line.

    export OCS_PASSWORD=...   # or the variable an inventory's password_env names: --password-env NAME
    harness ocs --url tcp://127.0.0.1:3082 --protocol polatis-tl1 --user admin connect 1 17
    harness ocs --url /dev/ttyUSB0 --protocol polatis-scpi list
    harness ocs --url ssh://127.0.0.1:830 --protocol polatis-netconf --user admin list
    harness ocs --bench lab-a.yaml --ocs ocs2 list      # a switch of a bench inventory, as a run reaches it

Only the ports named on the command line (for `disconnect`: the named ingresses and the far ends of their
patches) may be touched unless `--allowed-ports` says otherwise; with `--bench`, only those of them the
inventory allows.
Exit codes: 0 ok; 1 the switch refused or did not answer; 2 bad input (URL, protocol, port numbers).
"""
from __future__ import annotations

from harness.commands import TIMEOUT_S, integer

import argparse
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING

from devices.errors import DeviceError
from devices.ocs import OcsConfigError, get_protocol, open_switch, parse_url, protocol_names
from devices.ocs.registry import DEFAULT_PROTOCOL
from harness.errors import InputError

if TYPE_CHECKING:  # annotations only; the drivers' modules are imported where a command runs
    from devices.resources import OcsResource

DEFAULT_PASSWORD_ENV = "OCS_PASSWORD"  # the name ARCHITECTURE.md's inventory gives password_env


def register(subparsers) -> None:
    parser = subparsers.add_parser("ocs", help="query or change an optical circuit switch",
                                   description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bench", metavar="INVENTORY",
                       help="a bench inventory: the switch's protocol, URL, login and allowed ports come from it")
    where.add_argument("--url",
                        help="; ".join(f"{p.name}: " + ", ".join(f"{s}://" for s in p.schemes[:3])
                                       + (", a device path" if p.serial_paths else "")
                                       for p in map(get_protocol, protocol_names())))
    parser.add_argument("--ocs", metavar="NAME", help="with --bench: the switch (needed when it has several)")
    parser.add_argument("--protocol", help=f"one of {', '.join(protocol_names())} (default {DEFAULT_PROTOCOL})")
    parser.add_argument("--user", help="login (TL1 ACT-USER, NETCONF SSH user); none: no login")
    parser.add_argument("--password-env", default=DEFAULT_PASSWORD_ENV, metavar="NAME",
                        help="the environment variable holding the login password, as an inventory's "
                             f"password_env names it (default {DEFAULT_PASSWORD_ENV})")
    parser.add_argument("--password", help="the login password itself (other users can read it in the process "
                                           "list: prefer --password-env)")
    parser.add_argument("--allowed-ports", metavar="RANGES",
                        help="ports the command may touch, e.g. 1-8,17-24 (default: the ports named)")
    parser.add_argument("--size", default="0x0", metavar="NxM", help="switch size, informational")
    parser.add_argument("--baudrate", type=integer(50, 10_000_000), default=38400, help="serial line speed (SCPI over serial)")
    parser.add_argument("--timeout", type=TIMEOUT_S, default=30.0, help="seconds per command (default 30)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    connect = actions.add_parser("connect", help="patch INGRESS to EGRESS (the switch refuses a busy port)")
    connect.add_argument("ingress")
    connect.add_argument("egress")
    disconnect = actions.add_parser("disconnect", help="delete the patches on the given ingress ports")
    disconnect.add_argument("ports", nargs="+")
    apply = actions.add_parser("apply", help="reconcile to IN:OUT pairs (removes conflicting patches)")
    apply.add_argument("pairs", nargs="+", metavar="IN:OUT")
    apply.add_argument("--exclusive", action="store_true", help="also drop other patches on allowed ports")
    actions.add_parser("list", help="list cross-connects")
    power = actions.add_parser("power", help="optical power per port in dBm")
    power.add_argument("ports", nargs="+")
    actions.add_parser("identify", help="the switch's identity string")
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"port {text!r} is not a number") from None
    if value < 1:
        raise InputError(f"port {value} out of range (ports start at 1)")
    return value


MAX_SIDE = 4096  # ports per side of any switch we may meet (Polatis: up to 384x384); size 0x0 = unknown


def _from_bench(args: argparse.Namespace, named_ports: list[int]) -> OcsResource:
    """The inventory's switch, its allowlist narrowed to the ports this command names (or --allowed-ports)."""
    import dataclasses

    from devices.ocs.base import parse_port_ranges
    from harness.config import load_inventory

    given = [flag for flag, value in (("--url", args.url), ("--protocol", args.protocol), ("--user", args.user),
                                      ("--password", args.password)) if value is not None]
    if given:
        raise InputError(f"{', '.join(given)}: the inventory says it; drop it or drop --bench")
    bench = load_inventory(args.bench)
    names = list(bench.ocs)
    name = args.ocs or (names[0] if len(names) == 1 else None)
    if name is None:
        raise InputError(f"--ocs: the bench has switches {', '.join(names)}; name one", args.bench)
    if name not in bench.ocs:
        raise InputError(f"--ocs {name}: the bench has {', '.join(names)}", args.bench)
    resource = bench.ocs[name]
    try:
        wanted = (parse_port_ranges(args.allowed_ports, limit=sum(resource.size)) if args.allowed_ports
                  else frozenset(named_ports))
    except ValueError as exc:
        raise InputError(f"--allowed-ports: {exc}") from None
    args.inventory_allowed = resource.allowed_ports
    return dataclasses.replace(resource, allowed_ports=frozenset(wanted) & resource.allowed_ports)


def _resource(args: argparse.Namespace, named_ports: list[int]) -> OcsResource:
    from devices.ocs.base import parse_port_ranges
    from devices.resources import OcsResource

    if args.bench is not None:
        return _from_bench(args, named_ports)
    if args.ocs is not None:
        raise InputError("--ocs: names a switch of --bench INVENTORY")
    args.protocol = args.protocol or DEFAULT_PROTOCOL
    try:
        n, m = (int(x) for x in args.size.lower().split("x"))
        if not (0 <= n <= MAX_SIDE and 0 <= m <= MAX_SIDE):
            raise ValueError
    except ValueError:
        raise InputError(f"--size {args.size!r}: expected NxM with up to {MAX_SIDE} ports a side, e.g. 16x16") from None
    try:
        parse_url(args.url, args.protocol)
        allowed = (parse_port_ranges(args.allowed_ports, limit=(n + m) or 2 * MAX_SIDE) if args.allowed_ports
                   else frozenset(named_ports))
    except OcsConfigError as exc:
        raise InputError(str(exc)) from None
    except ValueError as exc:
        raise InputError(f"--allowed-ports: {exc}") from None
    password = args.password if args.password is not None else os.environ.get(args.password_env)
    return OcsResource(name="cli", protocol=args.protocol, url=args.url, size=(n, m), allowed_ports=allowed,
                       user=args.user, password=password, baudrate=args.baudrate)


def run(args: argparse.Namespace) -> int:
    pairs: dict[int, int] = {}
    named: list[int] = []
    if args.action == "connect":
        named = [_port(args.ingress), _port(args.egress)]
    elif args.action in ("disconnect", "power"):
        named = [_port(p) for p in args.ports]
    elif args.action == "apply":
        for item in args.pairs:
            ingress, sep, egress = item.partition(":")
            if not sep:
                raise InputError(f"pair {item!r}: expected IN:OUT, e.g. 1:17")
            pairs[_port(ingress)] = _port(egress)
        named = list(pairs) + list(pairs.values())
    resource = _resource(args, named)
    args.allow_ports_given = bool(args.allowed_ports)
    with contextlib.ExitStack() as held:
        if args.action in WRITES:  # a write shares the switch with runs: it takes the same lease
            held.enter_context(_lease(args, resource))
        return _open_and_act(args, resource, named, pairs)


WRITES = ("connect", "disconnect", "apply")


def _lease(args: argparse.Namespace, resource: OcsResource):
    from harness.lock import BenchLease, BenchLocked, lease_ttl, ocs_lease_keys

    try:
        return BenchLease(ocs_lease_keys(resource), run_id=f"harness ocs {args.action}",
                          ttl_s=lease_ttl()).acquire(keepalive=False)
    except BenchLocked as exc:
        raise InputError(f"bench is locked: {exc}") from None
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _open_and_act(args: argparse.Namespace, resource: OcsResource, named: list[int], pairs: dict[int, int]) -> int:
    try:
        switch = open_switch(resource, timeout_s=args.timeout)
    except OcsConfigError as exc:  # what the protocol needs and was not given, e.g. NETCONF's --user
        raise InputError(f"{exc} (harness ocs --user NAME)" if "give a user" in str(exc) else str(exc)) from None
    except DeviceError as exc:
        unset = resource.user and resource.password is None  # a key may do (NETCONF), so not refused before
        print(f"harness ocs: {exc}" + (f" (no password: {args.password_env} is not set)" if unset else ""),
              file=sys.stderr)
        return 1
    try:
        return _act(switch, args, named, pairs)
    except DeviceError as exc:
        hint = " (log in with --user and --password-env)" if getattr(exc, "code", "") == "PLNA" else ""
        print(f"harness ocs: {exc}{hint}", file=sys.stderr)
        return 1
    except ValueError as exc:
        raise InputError(str(exc)) from None
    finally:
        switch.close()


def _act(switch, args: argparse.Namespace, named: list[int], pairs: dict[int, int]) -> int:
    from devices.ocs.base import format_ports

    def emit(data, text: str) -> None:
        print(json.dumps(data) if args.json else text)

    def timed(timing) -> dict:
        return {"sent_ns": timing.sent_ns, "completed_ns": timing.completed_ns, "sent_bound_ns": timing.sent_bound_ns,
                "completed_bound_ns": timing.completed_bound_ns, "completed_stamp": timing.completed_stamp}

    if args.action == "disconnect" and not args.allow_ports_given:
        # naming an ingress names its patch: the far end may be touched too
        current = switch.patches()
        far = {current[i] for i in named if i in current}
        switch.allowed = switch.allowed | (far & args.inventory_allowed if args.bench else far)
    if args.action == "identify":
        ident = switch.identify()
        emit({"identity": ident}, ident)
    elif args.action == "list":
        patches = switch.patches()
        emit({str(i): e for i, e in sorted(patches.items())},
             "\n".join(f"{i} -> {e}" for i, e in sorted(patches.items())) or "no patches")
    elif args.action == "power":
        power = switch.port_power(named)
        emit({str(p): v for p, v in power.items()}, "\n".join(f"{p} {v:.2f} dBm" for p, v in power.items()))
    elif args.action == "connect":
        timing = switch.connect(*named)
        emit(timed(timing), f"connected {named[0]} -> {named[1]} in {timing.elapsed_s * 1e3:.2f} ms")
    elif args.action == "disconnect":
        timing = switch.disconnect(named)
        emit(timed(timing), f"disconnected {format_ports(named)} in {timing.elapsed_s * 1e3:.2f} ms")
    elif args.action == "apply":
        timing = switch.apply(pairs, exclusive=args.exclusive)
        emit(timed(timing), f"applied {len(pairs)} pair(s) in {timing.elapsed_s * 1e3:.2f} ms")
    return 0
