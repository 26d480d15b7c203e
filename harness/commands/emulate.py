"""`harness emulate`: run the emulated bench (OCS TL1/SCPI/NETCONF servers, SSH hosts) until interrupted."""
from __future__ import annotations

from harness.commands import SEED, integer

import os
import shlex
import signal
import sys
import threading

from devices.ocs.registry import DEFAULT_PROTOCOL, protocol_names

# The emulator is soft real time: its physics, the hosts' agents and SSH servers and the switch's replies each
# act at a due time, all threads of this one interpreter. At the default 5 ms switch interval a busy thread
# holds the others off up to that long: at 8 hosts x 8 NICs the switch's ENT-PATCH reply reached the harness
# p50 7.2-8.2 ms after its mirrors settled; at 0.2 ms, 2.1-2.4 ms (benchmarks/timestamp_accuracy.py --profile),
# for ~10 % more of the emulator's CPU. The physics' own lateness (p50 0.7-0.8 ms there) is not its doing.
SWITCH_INTERVAL_S = 0.0002


def register(sub) -> None:
    p = sub.add_parser("emulate", help="run the emulated bench until interrupted", description=__doc__)
    p.add_argument("--profile", default="mixnet-testbed", help="built-in profile name or a profile YAML")
    p.add_argument("--inventory-out", required=True, help="where to write the bench inventory YAML")
    p.add_argument("--truth-out", help="write the ground-truth log (JSON Lines) here on exit")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL, choices=protocol_names(),
                   help="the OCS protocol the inventory names (TL1 and SCPI are served either way)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--wire-out", help="write, on exit, when each emulated host's SSH sends began and where their "
                                      "bytes end in each connection (JSON; for delivery accounting: "
                                      "devices.sshhub.record_wire); with --workers 0 only")
    p.add_argument("--workers", type=integer(0, 256), default=0,
                   help="serve the hosts' SSH from this many processes over one physics (a pod); 0: this process")
    p.set_defaults(func=_emulate)


def _emulate(args) -> int:
    import gc
    import json
    import shutil
    from pathlib import Path

    from devices.emulated.bench import EMULATED_PASSWORD, EMULATED_USER, PASSWORD_ENV, EmulatedBench
    from harness.bench.emulated import load_profile
    from harness.errors import InputError
    profile = load_profile(args.profile)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    out = Path(args.inventory_out)
    if not out.parent.exists():
        raise InputError("--inventory-out: the folder does not exist", str(out.parent))
    if args.workers < 0:
        raise InputError("--workers: expected a number >= 0", str(args.workers))
    if args.wire_out and args.workers:
        raise InputError("--wire-out: the hosts' SSH runs in the workers' processes; use --workers 0",
                         str(args.workers))
    if args.wire_out:
        from devices.sshhub import record_wire

        wire = record_wire()  # before any server socket exists
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workdir = out.parent / (out.stem + ".bench")
    workdir.mkdir(exist_ok=True)
    with EmulatedBench(profile, seed=args.seed, protocol=args.protocol, workdir=workdir,
                       workers=args.workers) as bench:
        partial = out.with_name(out.name + ".partial")      # a reader never sees a half-written inventory
        shutil.copyfile(bench.inventory_path, partial)
        os.replace(partial, out)
        ocs = bench.ocs_servers
        print(f"emulated bench '{profile.name}' up; inventory: {out}", flush=True)
        print(f"  OCS ({args.protocol}, in the inventory): {bench.ocs_view.description}", flush=True)
        print(f"  TL1  tcp://{ocs.tl1_address[0]}:{ocs.tl1_address[1]}   SCPI tcp://{ocs.scpi_address[0]}:"
              f"{ocs.scpi_address[1]}   SCPI serial {ocs.pty_path}", flush=True)
        print(f"  OCS login {EMULATED_USER}, its password from ${PASSWORD_ENV} (the inventory's password_env): "
              f"harness ocs --url {shlex.quote(bench.ocs_view.url)} --protocol {args.protocol} --user {EMULATED_USER} "
              f"--password-env {PASSWORD_ENV} list", flush=True)
        print(f"export {PASSWORD_ENV}={shlex.quote(EMULATED_PASSWORD)}", flush=True)  # the emulated switch's
        for name, server in bench.host_servers.items():
            print(f"  {name}: ssh -i {server.client_key_path} -o UserKnownHostsFile={server.known_hosts_path} "
                  f"-p {server.port} {server.resource().user}@127.0.0.1", flush=True)
        # Everything made so far (modules, servers, keys) lives as long as the process: out of the collector's
        # sight, a full collection walks only what the run makes, not ~10^5 start-up objects with the GIL held.
        gc.freeze()
        stop.wait()
        # how late this machine let the schedule run: what the emulated delays on the wire include
        from harness.finish import emulator_line  # pandas, imported only now: the bench starts faster

        print(f"emulator schedule: {emulator_line(bench.physics.schedule_report())}", flush=True)
        if args.truth_out:
            with open(args.truth_out, "w") as f:
                for host in bench.physics.hosts:  # each host's true clock, for checking clock correction
                    f.write(json.dumps({"stage": "host_clock", "host": host,
                                        **bench.physics.host_clock_params(host)}) + "\n")
                for row in bench.ground_truth():
                    f.write(json.dumps(row) + "\n")
        if args.wire_out:
            with open(args.wire_out, "w") as f:
                json.dump([{"local": local, "peer": peer, "sent": record["sent"]}
                           for (local, peer), record in list(wire.items())], f)
    return 0
