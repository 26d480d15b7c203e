"""`harness sweep PLAYBOOK`: run a playbook's `sweep:` block (grid × seeds), each point an ordinary run
directory under SWEEP_DIR/points/, on a dask LocalCluster (default) or `--scheduler tcp://HOST:PORT`; the
results in SWEEP_DIR/results.parquet, the parameters as columns. Run the same command again to resume."""
from __future__ import annotations

from harness.commands import WORKERS, number


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a playbook's sweep: block (parameter grid x seeds) on dask",
                       description=__doc__)
    p.add_argument("playbook")
    p.add_argument("--bench", help="as for `harness run` (default: the playbook's bench)")
    p.add_argument("--out", help="sweep directory (default runs/<playbook>-sweep); the same one resumes")
    p.add_argument("--scheduler", help="a dask scheduler, tcp://HOST:PORT (default: a LocalCluster)")
    p.add_argument("--workers", type=WORKERS, default=2, help="LocalCluster workers (default 2)")
    p.add_argument("--serial", action="store_true", help="no cluster: the points one by one in this process")
    p.add_argument("--lease-wait", type=number(0, 7 * 86400), default=None, metavar="S",
                   help="how long a point on a physical bench waits for a bench lease someone else holds "
                        "(default 600 s; 0: fail at once, naming the holder)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="one machine-readable result line on stdout (sweep dir, "
                                                      "results file, points, failed points, exit code); the "
                                                      "progress bar and the summary stay on stderr")
    p.add_argument("--junit", metavar="FILE", help="also write every point's checks and claims as JUnit XML to FILE "
                                                  "(suites named POINT/SUITE)")
    p.set_defaults(func=_sweep)


def _sweep(args) -> int:
    import json
    import sys
    import time

    from harness import sweep
    from harness.errors import InputError

    if args.workers < 1:
        raise InputError(f"--workers: expected a positive number, found {args.workers}")
    if args.scheduler and not args.scheduler.startswith(("tcp://", "tls://")):
        raise InputError("--scheduler: expected tcp://HOST:PORT", args.scheduler)
    lease_wait = sweep.LEASE_WAIT_S if args.lease_wait is None else args.lease_wait
    if not lease_wait >= 0:
        raise InputError(f"--lease-wait: expected seconds >= 0, found {args.lease_wait}")
    started = time.monotonic()
    plan = sweep.plan(args.playbook, bench=args.bench, out=args.out, lease_wait_s=lease_wait)
    outcomes = sweep.execute(plan, scheduler=args.scheduler, workers=args.workers, serial=args.serial,
                             quiet=args.quiet)
    frame = sweep.gather(plan, outcomes)
    ran = sum(1 for o in outcomes if o.get("ran"))
    failed = [o for o in outcomes if o.get("exit_code") not in (0,)]
    out = sys.stderr if args.json else sys.stdout
    print(f"sweep {plan.sweep_dir}: {len(plan.points)} points ({ran} run now, {len(plan.points) - ran} already "
          f"finished) in {time.monotonic() - started:.1f} s; results: {plan.sweep_dir / sweep.RESULTS_NAME} "
          f"({len(frame)} rows)", file=out)
    for o in failed:
        print(f"  point {o['point']}: exit {o.get('exit_code')}" + (f": {o['error']}" if o.get("error") else ""),
              file=out)
    code = 0 if not failed else (2 if all(o.get("exit_code") == 2 for o in failed) else 1)
    if args.junit:
        from pathlib import Path

        from harness.junit import sweep_junit_xml
        from harness.record import write_text_atomic

        write_text_atomic(Path(args.junit), sweep_junit_xml(plan.sweep_dir.name,
                                                            [(job.name, Path(job.run_dir)) for job in plan.jobs]))
    if args.json:
        print(json.dumps({"sweep_dir": str(plan.sweep_dir), "results": str(plan.sweep_dir / sweep.RESULTS_NAME),
                          "points": len(plan.points), "ran": ran, "rows": len(frame), "exit_code": code,
                          "failed": [{"point": o["point"], "exit_code": o.get("exit_code"),
                                      "error": o.get("error")} for o in failed]}), flush=True)
    return code
