"""`harness run PLAYBOOK`: execute a playbook on the emulated bench or a real one."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("run", help="run a playbook", description=__doc__)
    p.add_argument("playbook", nargs="?", help="playbook YAML (with --resume: taken from the run record; if "
                                               "given it must be the run's own)")
    p.add_argument("--bench", help="emulated:PROFILE[?ocs=PROTOCOL], emulated-netns:PROFILE, emulated-sshd:PROFILE or an "
                                   "inventory YAML "
                                   "(default: the playbook's bench)")
    p.add_argument("--out", help="run directory (default runs/<UTC timestamp>-<playbook>)")
    p.add_argument("--seed", type=int, help="override the playbook's seed")
    p.add_argument("--cycles", type=int, help="override the number of cycles")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last complete cycle, on the "
                   "same bench with the same playbook, cycles and seed (anything else is refused)")
    p.add_argument("--dry-run", action="store_true", help="print the planned reconfigurations; touch nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--adopt-current-state", action="store_true",
                   help="a switch another run left changed (see `harness bench restore`): take its current "
                        "cross-connects as the original (recorded in the manifest)")
    p.add_argument("--json", action="store_true", help="one machine-readable result line on stdout (run dir, "
                                                      "status, exit code, checks); progress stays on stderr")
    p.add_argument("--junit", metavar="FILE", help="also write the run's checks and claims as JUnit XML to FILE")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json

    from harness.errors import InputError
    from harness.runner import RunOptions, run

    options = RunOptions(playbook=args.playbook, bench=args.bench, out=args.out, seed=args.seed,
                         cycles=args.cycles, resume=args.resume, dry_run=args.dry_run, quiet=args.quiet,
                         json=args.json, adopt_current_state=args.adopt_current_state, junit=args.junit)
    try:
        return run(options)
    except InputError as exc:
        if args.json:
            print(json.dumps({"run_dir": None, "status": "input_error", "exit_code": 2, "error": exc.format()}),
                  flush=True)
        raise
