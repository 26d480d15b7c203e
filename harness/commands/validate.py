"""`harness validate FILE...`: check inventories, playbooks and timing profiles without touching any hardware."""
from __future__ import annotations

import argparse
import sys

from harness.errors import InputError


def discover_steps():
    """The registered step types; harness.config (pydantic) is imported here, not at every CLI start-up."""
    from harness.config import discover_steps

    return discover_steps()


def describe_file(path: str, connect: bool = False) -> str:
    """Validate one file; return a one-line description, raise InputError on the first problem. `connect`:
    an inventory's secrets must be set too (without, their variables may be unset: CI lints without them)."""
    from harness.config import bench_from_data, load_yaml, looks_like, playbook_from_data

    loaded = load_yaml(path)
    kind = looks_like(loaded.data)
    if kind == "inventory":
        bench = bench_from_data(loaded.data, path, secrets=connect)
        return (f"inventory {bench.name!r}: {len(bench.ocs)} OCS, {len(bench.hosts)} hosts, "
                f"{len(bench.nic_ports)} NIC ports{', emulated' if bench.emulated else ''}")
    if kind == "playbook":
        playbook = playbook_from_data(loaded, path, discover_steps())
        return (f"playbook {playbook.name!r}: {len(playbook.steps)} steps, {playbook.cycles} cycles, "
                f"bench {playbook.bench}")
    if kind == "profile":
        from harness.bench.emulated import load_profile

        profile = load_profile(path)
        return (f"timing profile {profile.name!r}: {profile.topology.hosts} hosts × {profile.topology.nics_per_host} "
                f"NIC ports, OCS switch mean {profile.ocs['switch'].mean_s * 1e3:g} ms")
    raise InputError("cannot tell what this is: an inventory has 'bench', 'ocs' and 'hosts'; a playbook "
                     "has 'steps'; a timing profile has 'nic', 'topology' or 'source'", path, loaded.data.line)


def run(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            print(f"{path}: ok ({describe_file(path, connect=args.connect)})")
        except InputError as exc:
            # One line per problem, whatever characters the file smuggled into the message.
            for problem in getattr(exc, "errors", [exc]):
                print("harness: " + problem.format().replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
            status = 2
    return status


def register(subparsers) -> None:
    parser = subparsers.add_parser("validate", help="check inventory, playbook and timing profile files",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", metavar="FILE", help="inventory, playbook or timing profile YAML")
    parser.add_argument("--connect", action="store_true",
                        help="also check what connecting needs: every variable an inventory's password_env names "
                             "is set (without this, an inventory is checked without its secrets)")
    parser.set_defaults(func=run)
