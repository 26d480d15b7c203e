"""`harness bench discover` and `harness bench check` (actions of the `bench` group, added by bench.py).

discover --hosts HOST[,HOST...] [--ocs URL --protocol P --ocs-size N,M]: log into each host ([USER@]ADDRESS[:PORT]),
  list its RDMA ports, netdevs, transceivers (ethtool -m), GPUs and GPU<->NIC affinity (nvidia-smi topo -m), and
  write a draft inventory (`harness validate` accepts it; its fibre map is a placeholder until checked).
check INVENTORY: every host, NIC port, RDMA port and switch named is there; then, under the bench lease, the
  fibre map through each OCS (one candidate circuit at a time, allowed ports only, original cross-connects
  restored and read back) and whose light each TX fibre carries (each NIC set down in turn with
  `ip link set dev X down`, needs CAP_NET_ADMIN; the ingress that goes dark on the switch's power monitors is
  its fibre; its admin and RDMA port states read back as before). Exit 0 all verified (WARN lines name a TX
  identity that could not be checked), 1 a mismatch or a restore that did not verify, 2 bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.commands import TIMEOUT_S


def register(sub) -> None:
    """Nothing at the top level: `harness bench` (bench.py) adds these actions to its group."""


def add_actions(actions) -> None:
    d = actions.add_parser("discover", help="list what the hosts have and write a draft inventory",
                           description=__doc__)
    d.add_argument("--hosts", required=True, help="HOST[,HOST...], each [USER@]ADDRESS[:PORT]")
    d.add_argument("--user", default="root", help="SSH user where a host names none (default root)")
    d.add_argument("--identity-file")
    d.add_argument("--known-hosts", help="known_hosts file (strict host keys unless --emulated)")
    d.add_argument("--emulated", action="store_true", help="the bench is emulated: accept unknown host keys")
    d.add_argument("--ocs", metavar="URL", help="the switch the NICs are cabled to")
    d.add_argument("--protocol", default="polatis-tl1")
    d.add_argument("--ocs-size", default=None, metavar="N,M", help="ingress,egress port counts (with --ocs)")
    d.add_argument("--ocs-user")
    d.add_argument("--password-env", help="environment variable holding the OCS password")
    d.add_argument("--out", default="-", help="draft inventory file (default: stdout)")
    d.set_defaults(func=_discover)
    c = actions.add_parser("check", help="verify hosts, NICs, switches and the fibre map of an inventory",
                           description=__doc__)
    c.add_argument("inventory", metavar="INVENTORY")
    c.add_argument("--quick", action="store_true", help="hosts, NICs and switches only (no fibre map)")
    c.add_argument("--light-timeout", type=TIMEOUT_S, default=2.0,
                   help="seconds to wait for a receiver to see light after a circuit settles (default 2)")
    c.add_argument("--link-command", default=None, metavar="TEMPLATE",
                   help="how a host sets a NIC down/up for the TX identity probe (default "
                        "'ip link set dev {netdev} {state}'; without root e.g. 'sudo -n ip link set dev {netdev} {state}')")
    c.set_defaults(func=_check)


def _host(word: str, args, index: int):
    from devices.resources import HostResource
    from harness.errors import InputError

    user, _, rest = word.rpartition("@")
    address, colon, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    if not address or (colon and not port.isdigit()):
        raise InputError(f"--hosts: {word!r} is not [USER@]ADDRESS[:PORT]")
    return HostResource(name=f"host{index}", address=address, port=int(port) if colon else 22,
                        user=user or args.user, identity_file=args.identity_file, known_hosts=args.known_hosts,
                        strict_host_key=not args.emulated)


def _discover(args) -> int:
    from dataclasses import replace

    from devices.errors import DeviceError
    from harness import preflight
    from harness.errors import InputError

    words = [w.strip() for w in args.hosts.split(",") if w.strip()]
    if not words:
        raise InputError("--hosts: no host given")
    ocs = None
    if args.ocs:
        try:
            n, m = (int(x) for x in (args.ocs_size or "").split(","))
        except ValueError:
            raise InputError("--ocs needs --ocs-size N,M (ingress,egress port counts)") from None
        ocs = {"protocol": args.protocol, "url": args.ocs, "size": [n, m]}
        ocs.update({k: v for k, v in (("user", args.ocs_user), ("password_env", args.password_env)) if v})
    found = {}
    for i, word in enumerate(words, 1):
        res = _host(word, args, i)
        try:
            facts = preflight.discover_host(res)
        except DeviceError as exc:
            print(f"harness bench discover: {res.address}: {exc}", file=sys.stderr)
            return 1
        name = facts["hostname"] if facts["hostname"] not in found else f"{facts['hostname']}-{i}"
        found[name] = (replace(res, name=name), facts)
        gpus = len(facts["gpus"])
        print(f"{name}: {len(facts['nics'])} RDMA port(s), {gpus} GPU(s)", file=sys.stderr)
    text = preflight.draft_text(found, ocs)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(f"draft inventory: {args.out} (fibre map unverified: harness bench check {args.out})", file=sys.stderr)
    return 0


def _check(args) -> int:
    from devices.errors import DeviceError
    from devices.parsers.common import ParseError
    from harness import preflight
    from harness.config import load_inventory
    from harness.runner import _acquire_lease

    from harness.errors import InputError

    try:
        link_command = preflight.check_link_command(args.link_command or preflight.LINK_COMMAND)
    except ValueError as exc:
        raise InputError(f"--link-command: {exc}") from None
    bench = load_inventory(args.inventory)
    problems = preflight.quick_check(bench)
    for line in problems:
        print(f"FAIL {line}")
    if problems:
        return 1
    print(f"ok   {len(bench.hosts)} host(s), {len(bench.nic_ports)} NIC port(s), {len(bench.ocs)} switch(es) answer")
    if args.quick:
        return 0
    lease = _acquire_lease(bench, args.inventory, "harness bench check")
    failed = False
    try:
        for name in bench.ocs:
            try:
                report = preflight.fibre_map(bench, name, light_s=args.light_timeout, link_command=link_command)
            except (DeviceError, ParseError) as exc:  # the bench was restored on the way out (fibre_map's finally)
                print(f"FAIL {name}: fibre map stopped: {exc}")
                failed = True
                continue
            for line in report.findings:
                print(f"FAIL {name}: {line}")
            for line in report.unverified:
                print(f"WARN {name}: {line}")
            if not report.findings:
                print(f"ok   {name}: every fibre where the inventory says ({len(report.ok)} NIC loops lit, "
                      f"{len(report.tests)} circuits tried; {len(report.identified)} TX fibres carry their own "
                      f"NIC's light: dark at {report.identity_by or 'nothing watched'} while that NIC was set down)")
            print(("ok   " if report.restored else "FAIL ") + f"{name}: original cross-connects "
                  + ("restored and read back" if report.restored else f"NOT restored: {report.restore_error}"))
            print(("ok   " if report.links_restored else "FAIL ") + f"{name}: NIC admin and RDMA port states "
                  + ("as before, read back" if report.links_restored else f"NOT as before: {report.links_error}"))
            failed |= not report.passed
    finally:
        if lease is not None:
            lease.release()
    return 1 if failed else 0
