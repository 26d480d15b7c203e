"""`harness parse`: read a tool's captured output with one of the project's parsers, or a lab plugin's.

    harness parse ethtool-module capture.txt         # the parsed value as JSON
    ssh gpu1 ethtool -m ens1f0np0 | harness parse ethtool-module -
    harness parse --list

Exit codes: 0 parsed; 1 the parser itself failed (a bug, named); 2 unknown parser, unreadable file, or text the
parser cannot read (its message).
"""
from __future__ import annotations

import argparse
import json
import sys

from harness.errors import InputError


def register(subparsers) -> None:
    parser = subparsers.add_parser("parse", help="parse a tool's captured output (ethtool -m, mlxlink, ...)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("parser", nargs="?", help="the parser's name (--list shows them)")
    parser.add_argument("file", nargs="?", default="-", help="the capture; - or none: standard input")
    parser.add_argument("--list", action="store_true", help="list the parsers and the tools they read")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from devices.parsers.registry import get_parser, parser_names
    from harness.record import to_jsonable

    if args.list:
        for name in parser_names():
            print(f"{name:20} {get_parser(name).tool}")
        return 0
    if not args.parser:
        raise InputError("harness parse: name a parser (harness parse --list)")
    try:
        entry = get_parser(args.parser)
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    try:
        parse = entry.load()
    except Exception as exc:  # a plugin's parser that does not import: named, not a traceback
        raise InputError(f"parser {entry.name!r} ({entry.parse}): {type(exc).__name__}: {exc}") from None
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8", errors="replace").read()
    except OSError as exc:
        raise InputError(f"cannot read the capture: {exc.strerror}", args.file) from None
    try:
        value = parse(text)
    except ValueError as exc:  # ParseError: what the parser expected
        raise InputError(f"{args.parser}: {exc}", args.file) from None
    except Exception as exc:  # the parser's own fault, not the capture's
        print(f"harness parse: parser {entry.name!r} ({entry.parse}) failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    print(json.dumps(to_jsonable(value), indent=1, sort_keys=True, default=str))
    return 0
