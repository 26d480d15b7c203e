"""`harness` command line. Each sub-command lives in its own module under harness/commands/ and exposes
`register(subparsers)`; the module's parser sets `func(args) -> int`. Labs add commands by adding a module.

Exit codes: 0 ok; 1 the run ran but a check failed; 2 bad input or usage.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import harness.commands
from harness.errors import InputError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's default exits 2 too; keep its one-line style
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ocs-hil")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked for (the lookup scans every
    installed distribution, ~70 ms of CPU, half of each CLI start-up when the parser did it)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"harness (ocs-hil) {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="harness", description="Hardware-in-the-loop harness for reconfigurable optical "
                     "networks: measure OCS reconfiguration turnaround and test the claims built on it.",
                     epilog="Exit codes: 0 ok; 1 the run ran but a check failed; 2 bad input or usage.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for info in sorted(pkgutil.iter_modules(harness.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"harness.commands.{info.name}")
        module.register(sub)
    for p in _parsers(parser):  # before or after the command: `harness -v run` = `harness run -v`
        default = 0 if p is parser else argparse.SUPPRESS
        p.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=default,
                       help="show INFO logs on stderr (SSH connections, paramiko's among them)")
        p.add_argument("--debug", dest="verbosity", action="store_const", const=2, default=default,
                       help="show DEBUG logs on stderr, every wire record too (also in a run's wire.log)")
    return parser


def _parsers(parser: argparse.ArgumentParser):
    """`parser` and every sub-command's parser under it (`harness ocs ... list` has two levels)."""
    yield parser
    for action in parser._actions:  # argparse keeps sub-parsers only there
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield from _parsers(child)


def main(argv: list[str] | None = None) -> int:
    # Arrow's C++ default pool (its Parquet readers' and datasets') on the C library's allocator, which gives freed
    # memory back (harness.runner.memory_handed_back): mimalloc kept what a campaign's end read a block at a time,
    # ~50 MiB more at its peak. Fixed at Arrow's first allocation, so set here; inherited by worker processes; the
    # user's own choice stands.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    args = build_parser().parse_args(argv)  # --version and --help end here, before the logs' rich import
    from harness import logs

    try:
        with logs.verbosity(args.verbosity):
            return int(args.func(args) or 0)
    except InputError as exc:
        for problem in getattr(exc, "errors", [exc]):  # every problem of a file, one line each
            print(f"harness: {problem.format()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    except OSError as exc:  # the machine, not the input: a full disk, a read-only or vanished directory
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"harness: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
