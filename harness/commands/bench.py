"""`harness bench restore RUN_DIR`: put the switch back to what a dead run found, and verify it.

A run killed before its teardown (SIGKILL, power loss) or whose restore failed leaves the switch in its
last state; `restore.json` in its run directory holds the cross-connects it found. This command restores
them on the inventory's allowed ports (never any other port), under the bench lease, reads the switch
back, and clears the pending-restore note that makes fresh runs refuse the bench. Exit 0 when every
switch verified, 1 when one did not, 2 for bad input.
"""
from __future__ import annotations

from harness.commands import TIMEOUT_S

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("bench", help="bench recovery, discovery and preflight checks", description=__doc__)
    actions = p.add_subparsers(dest="bench_action", metavar="ACTION", required=True)
    restore = actions.add_parser("restore", help="restore the cross-connects a dead run found, and verify them",
                                 description=__doc__)
    restore.add_argument("run_dir", metavar="RUN_DIR")
    restore.add_argument("--bench", help="the inventory (default: the run's, or its copy in RUN_DIR/inputs)")
    restore.add_argument("--timeout", type=TIMEOUT_S, default=15.0, help="seconds per OCS command (default 15)")
    restore.set_defaults(func=_restore)
    from harness.commands import bench_preflight

    bench_preflight.add_actions(actions)


def _restore(args) -> int:
    from harness import recovery, resume
    from harness.config import load_inventory
    from harness.errors import InputError
    from harness.lock import RunDirLock, RunDirLocked
    from harness.record import write_json_atomic
    from harness.runner import _acquire_lease

    run_dir = Path(args.run_dir)
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"not a run directory: {exc}", str(run_dir)) from None
    spec = args.bench or (manifest.get("run") or {}).get("bench") or (manifest.get("extra") or {}).get("bench")
    if not spec:
        raise InputError("the run record names no bench; give --bench INVENTORY.yaml", str(run_dir))
    if resume.bench_kind(spec) != "inventory":
        print(f"harness bench: {run_dir} ran on its own emulator ({spec}), which ended with it: nothing to restore")
        return 0
    if not Path(spec).is_file() and args.bench is None:
        spec = str(run_dir / resume.INPUTS / "bench.yaml")
    bench = load_inventory(spec)
    try:
        held = RunDirLock(run_dir).acquire(run_dir.name)
    except RunDirLocked as exc:
        raise InputError(f"the run is still running: {exc}") from None
    clean = recovery.restored_cleanly(run_dir, bench, manifest)
    if clean:
        held.release()
        print(f"harness bench: {run_dir} put {', '.join(clean)} back as found and verified it; nothing to "
              "restore (restoring again would undo what came after the run)")
        return 0
    lease = _acquire_lease(bench, spec, f"harness bench restore {run_dir.name}")
    try:
        results = recovery.restore_run(run_dir, bench, timeout_s=args.timeout)
    finally:
        lease.release()
        held.release()
    if not results:
        print(f"harness bench: {run_dir} snapshotted no switch: nothing to restore")
        recovery.clear_pending(bench, run_dir)
        return 0
    for r in results:
        print(f"{r.ocs}: {r.detail}", file=sys.stdout if r.verified else sys.stderr)
    manifest.setdefault("extra", {})["restored_by_command"] = {r.ocs: r.verified for r in results}
    write_json_atomic(run_dir / "manifest.json", manifest)
    return 0 if all(r.verified for r in results) else 1
