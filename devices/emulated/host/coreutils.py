"""The filters engineers pipe tool output into on the emulated host: grep, head, tail, wc, sort, cut, uniq, tr.

Pure functions of (argv, stdin, a file reader) -> (stdout, stderr, exit status), behaving as GNU grep 3.8 and
GNU coreutils 9.1 do in the C locale (bytes, ASCII classes). tests/test_emulated_shell.py holds them to the real
tools of the machine running the tests, byte for byte. An option outside the emulated set is refused with a clear
message (exit 2) rather than silently ignored.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Callable

Reader = Callable[[str], "bytes | None"]  # a file of the host by the word naming it, None if there is none
Stdin = "bytes | Callable[[], bytes]"  # stdin, or how to read it (only when a filter reads it: no blocking otherwise)
Result = tuple[bytes, bytes, int]

_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")
_GREP_USAGE = "Usage: grep [OPTION]... PATTERNS [FILE]...\nTry 'grep --help' for more information.\n"


class _Usage(Exception):
    """A command line the filter refuses: (message for stderr, exit status)."""


def lines(data: bytes) -> list[bytes]:
    """Lines with their newline; a last line without one stays without."""
    return _LINE.findall(data)


def _unsupported(tool: str, option: str) -> _Usage:
    return _Usage(f"{tool}: emulated host: option {option} is not supported\n")


def _inputs(tool: str, files: list[str], stdin: Stdin, read: Reader) -> tuple[list[tuple[str, bytes | None]], bytes]:
    """(name, content or None when missing) per operand (stdin for none or `-`), and the errors to print."""
    out, errors = [], b""
    for word in files or ["-"]:
        content = (stdin() if callable(stdin) else stdin) if word == "-" else read(word)
        if word == "-":
            stdin = b""  # read once: a second `-` finds it at its end
        if content is None:
            errors += f"{tool}: {word}: No such file or directory\n".encode()
        out.append(("(standard input)" if word == "-" else word, content))
    return out, errors


# ---------------------------------------------------------------------------------------------------- grep

_POSIX_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
                  "space": r" \t\n\r\f\v", "blank": r" \t", "xdigit": "0-9A-Fa-f",
                  "punct": r"!-/:-@\[-`{-~", "cntrl": r"\x00-\x1f\x7f", "print": r" -~", "graph": r"!-~"}


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """A POSIX bracket expression starting at pattern[i] == '[' as a Python class; returns (class, next index)."""
    j, out = i + 1, "["
    if j < len(pattern) and pattern[j] == "^":
        out, j = out + "^", j + 1
    if j < len(pattern) and pattern[j] == "]":
        out, j = out + r"\]", j + 1
    while j < len(pattern) and pattern[j] != "]":
        if pattern.startswith("[:", j):
            end = pattern.find(":]", j + 2)
            name = pattern[j + 2:end] if end > 0 else ""
            if name not in _POSIX_CLASSES:
                raise _Usage("grep: character class syntax is [[:space:]], not [:space:]\n"
                             if end < 0 else "grep: Invalid character class name\n")
            out, j = out + _POSIX_CLASSES[name], end + 2
            continue
        out += "\\" + pattern[j] if pattern[j] in "\\[" else pattern[j]
        j += 1
    if j >= len(pattern):
        raise _Usage("grep: Unmatched [, [^, [:, [., or [=\n")
    return out + "]", j + 1


def _translate(pattern: str, extended: bool) -> str:
    """A POSIX basic/extended regular expression (GNU flavour) as a Python one."""
    out, i = "", 0
    special = "+?(){}|"
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            cls, i = _bracket(pattern, i)
            out += cls
            continue
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            i += 2
            if n in special:
                out += ("\\" + n) if extended else n  # BRE: \( \) \| \+ ... are the operators
            elif n == "<":
                out += r"\b(?=\w)"
            elif n == ">":
                out += r"\b(?<=\w)"
            elif n in "wWsSb" or n.isdigit():
                out += "\\" + n
            else:
                out += re.escape(n)
            continue
        if c in special and not extended:
            out += "\\" + c
        elif c == "*" and (not out or out.endswith(("^", "(", "|"))):
            out += r"\*"  # a leading star is literal
        elif c == "{" and extended and not re.match(r"\{\d*(,\d*)?\}", pattern[i:]):
            out += r"\{"
        else:
            out += c
        i += 1
    return out


def grep(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """GNU grep with -i -v -c -q -n -w -x -E -F -G -e PATTERN -h -H -s."""
    flags, patterns, operands = set(), [], []
    args = iter(argv[1:])
    for word in args:
        if word == "--" or not word.startswith("-") or word == "-":
            operands.append(word) if word != "--" else operands.extend(args)
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter == "e":
                value = letters or next(args, None)
                if value is None:
                    return b"", ("grep: option requires an argument -- 'e'\n" + _GREP_USAGE).encode(), 2
                patterns.append(value)
                letters = ""
            elif letter in "ivcqnwxEFGhHs":
                flags.add(letter)
            else:
                return b"", str(_unsupported("grep", "-" + letter)).encode(), 2
    if not patterns:
        if not operands:
            return b"", _GREP_USAGE.encode(), 2
        patterns.append(operands.pop(0))
    alternatives = [p for pattern in patterns for p in pattern.split("\n")]
    try:
        if "F" in flags:
            body = "|".join(re.escape(p) for p in alternatives)
        else:
            body = "|".join(f"(?:{_translate(p, 'E' in flags)})" for p in alternatives)
        if "x" in flags:
            body = rf"\A(?:{body})\Z"
        elif "w" in flags:
            body = rf"(?<!\w)(?:{body})(?!\w)"
        regex = re.compile(body.encode(), re.ASCII | (re.IGNORECASE if "i" in flags else 0))
    except _Usage as exc:
        return b"", str(exc).encode(), 2
    except re.error as exc:
        return b"", f"grep: emulated host: cannot compile {patterns!r}: {exc}\n".encode(), 2
    inputs, errors = _inputs("grep", operands, stdin, read)
    if "s" in flags:
        errors = b""
    named = ("H" in flags or len(inputs) > 1) and "h" not in flags
    out, selected = b"", False
    for name, content in inputs:
        if content is None:
            continue
        count = 0
        for number, line in enumerate(lines(content), 1):
            text = line[:-1] if line.endswith(b"\n") else line
            if bool(regex.search(text)) == ("v" in flags):
                continue
            count += 1
            selected = True
            if "q" in flags:
                return b"", b"", 0
            if "c" not in flags:
                prefix = (name.encode() + b":" if named else b"") + (b"%d:" % number if "n" in flags else b"")
                out += prefix + text + b"\n"
        if "c" in flags:
            out += (name.encode() + b":" if named else b"") + b"%d\n" % count
    missing = any(content is None for _, content in inputs)
    return out, errors, 2 if missing else (0 if selected else 1)


# ---------------------------------------------------------------------------------------------------- head, tail


def _count_option(tool: str, argv: list[str]) -> tuple[str, list[str]]:
    """`-n N`, `-nN`, `-N` (and `-n -N`, `-n +N`): the count word as given; the operands."""
    count, operands = "10", []
    args = iter(argv[1:])
    for word in args:
        if word == "-n":
            count = next(args, None)
            if count is None:
                raise _Usage(f"{tool}: option requires an argument -- 'n'\n"
                             f"Try '{tool} --help' for more information.\n")
        elif word.startswith("-n"):
            count = word[2:]
        elif re.fullmatch(r"-\d+", word):
            count = word[1:]
        elif word.startswith("-") and word != "-":
            raise _unsupported(tool, word)
        else:
            operands.append(word)
    if not re.fullmatch(r"[-+]?\d+", count):
        raise _Usage(f"{tool}: invalid number of lines: '{count}'\n")
    return count, operands


def _head_tail(tool: str, argv: list[str], stdin: Stdin, read: Reader) -> Result:
    try:
        count, operands = _count_option(tool, argv)
    except _Usage as exc:
        return b"", str(exc).encode(), 1
    inputs, errors = _inputs(tool, operands, stdin, read)
    out, first = b"", True
    for name, content in inputs:
        if content is None:
            continue
        if len(inputs) > 1:
            out += ("" if first else "\n").encode() + f"==> {name} <==\n".encode()
            first = False
        rows, n = lines(content), int(count.lstrip("+-"))
        if tool == "head":
            chosen = rows[:max(len(rows) - n, 0)] if count.startswith("-") else rows[:n]
        else:
            chosen = rows[n - 1 if n else 0:] if count.startswith("+") else (rows[-n:] if n else [])
        out += b"".join(chosen)
    return out, errors, 1 if errors else 0


def head(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    return _head_tail("head", argv, stdin, read)


def tail(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    return _head_tail("tail", argv, stdin, read)


# ---------------------------------------------------------------------------------------------------- wc


def wc(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """`wc [-l] [-w] [-c]`; counts right-aligned to one width: 1 for a single count of a single input, else
    wide enough for the inputs' total size (7 at least when one is a pipe), as coreutils computes it."""
    chosen, operands = "", []
    for word in argv[1:]:
        if word.startswith("-") and word != "-":
            for letter in word[1:]:
                if letter not in "lwc":
                    return b"", str(_unsupported("wc", "-" + letter)).encode(), 1
                chosen += letter
        else:
            operands.append(word)
    order = [c for c in "lwc" if c in chosen] or ["l", "w", "c"]
    inputs, errors = _inputs("wc", operands, stdin, read)
    rows, total = [], [0, 0, 0]
    for name, content in inputs:
        if content is None:
            continue
        counts = [content.count(b"\n"), len(content.split()), len(content)]
        total = [a + b for a, b in zip(total, counts)]
        rows.append((counts, name if operands else None))
    if len(inputs) > 1:
        rows.append((total, "total"))
    if len(order) == 1 and len(inputs) == 1:
        width = 1
    else:
        size = sum(len(c) for word, (_, c) in zip(operands or ["-"], inputs) if c is not None and word != "-")
        width = max(len(str(size)), 7 if (not operands or "-" in operands) else 1)
    out = ""
    for counts, name in rows:
        fields = [str(counts["lwc".index(c)]).rjust(width) for c in order]
        out += " ".join(fields + ([name] if name is not None else [])) + "\n"
    return out.encode(), errors, 1 if errors else 0


# ---------------------------------------------------------------------------------------------------- sort

_NUMBER = re.compile(rb"[ \t]*(-?)(\d*)(?:\.(\d*))?")


def _numeric(line: bytes) -> Decimal:
    """sort -n's key: a leading decimal number (blanks, sign, digits, a fraction); none is zero."""
    sign, whole, frac = _NUMBER.match(line).groups()
    if not whole and not frac:
        return Decimal(0)
    return Decimal(f"{sign.decode()}{whole.decode() or '0'}.{(frac or b'').decode() or '0'}")


def sort(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """`sort [-n] [-r] [-u]` in the C locale: bytes order; -n ties broken by the whole line unless -u."""
    flags, operands = set(), []
    for word in argv[1:]:
        if word.startswith("-") and word != "-":
            for letter in word[1:]:
                if letter not in "nru":
                    return b"", str(_unsupported("sort", "-" + letter)).encode(), 2
                flags.add(letter)
        else:
            operands.append(word)
    inputs, errors = _inputs("sort", operands, stdin, read)
    if errors:
        return b"", errors.replace(b"sort: ", b"sort: cannot read: ", 1), 2
    rows = [(line[:-1] if line.endswith(b"\n") else line) for _, content in inputs for line in lines(content)]
    if "n" in flags:
        key = (lambda r: _numeric(r)) if "u" in flags else (lambda r: (_numeric(r), r))
    else:
        key = lambda r: r  # noqa: E731
    rows = sorted(rows, key=key, reverse="r" in flags)
    if "u" in flags:
        kept, last = [], object()
        for row in rows:
            if key(row) != last:
                kept.append(row)
                last = key(row)
        rows = kept
    return b"".join(r + b"\n" for r in rows), b"", 0


# ---------------------------------------------------------------------------------------------------- cut


def _field_list(spec: str) -> Callable[[int], bool]:
    ranges = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d*)(-?)(\d*)", part)
        if not m or not part or part == "-" or (not m.group(2) and not m.group(1)):
            raise _Usage(f"cut: invalid field value '{part}'\nTry 'cut --help' for more information.\n")
        low = int(m.group(1) or 1)
        high = int(m.group(3)) if m.group(3) else (low if not m.group(2) else 1 << 62)
        if low == 0:
            raise _Usage("cut: fields are numbered from 1\nTry 'cut --help' for more information.\n")
        ranges.append((low, high))
    return lambda n: any(lo <= n <= hi for lo, hi in ranges)


def cut(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """`cut -f LIST [-d DELIM] [-s]`: fields of each line; a line without the delimiter whole (unless -s)."""
    delim, spec, only, operands = "\t", None, False, []
    args = iter(argv[1:])
    try:
        for word in args:
            if word in ("-d", "-f"):
                value = next(args, None)
                if value is None:
                    raise _Usage(f"cut: option requires an argument -- '{word[1]}'\n"
                                 "Try 'cut --help' for more information.\n")
                delim, spec = (value, spec) if word == "-d" else (delim, value)
            elif word.startswith("-d"):
                delim = word[2:]
            elif word.startswith("-f"):
                spec = word[2:]
            elif word == "-s":
                only = True
            elif word.startswith("-") and word != "-":
                raise _unsupported("cut", word)
            else:
                operands.append(word)
        if len(delim) != 1:
            raise _Usage("cut: the delimiter must be a single character\nTry 'cut --help' for more information.\n")
        if spec is None:
            raise _Usage("cut: you must specify a list of bytes, characters, or fields\n"
                         "Try 'cut --help' for more information.\n")
        wanted = _field_list(spec)
    except _Usage as exc:
        return b"", str(exc).encode(), 1
    sep = delim.encode()
    inputs, errors = _inputs("cut", operands, stdin, read)
    out = b""
    for _, content in inputs:
        for line in lines(content or b""):
            text = line[:-1] if line.endswith(b"\n") else line
            if sep not in text:
                out += b"" if only else text + b"\n"
                continue
            out += sep.join(f for n, f in enumerate(text.split(sep), 1) if wanted(n)) + b"\n"
    return out, errors, 1 if errors else 0


# ---------------------------------------------------------------------------------------------------- uniq


def uniq(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """`uniq [-c] [-d] [-u] [INPUT]`: adjacent equal lines once; -c prefixes the count as "%7d "."""
    flags, operands = set(), []
    for word in argv[1:]:
        if word.startswith("-") and word != "-":
            for letter in word[1:]:
                if letter not in "cdu":
                    return b"", str(_unsupported("uniq", "-" + letter)).encode(), 1
                flags.add(letter)
        else:
            operands.append(word)
    if len(operands) > 1:
        return b"", str(_unsupported("uniq", "OUTPUT")).encode(), 1
    inputs, errors = _inputs("uniq", operands, stdin, read)
    content = inputs[0][1]
    if content is None:
        return b"", errors, 1
    groups: list[list] = []
    for line in lines(content):
        text = line[:-1] if line.endswith(b"\n") else line
        if groups and groups[-1][0] == text:
            groups[-1][1] += 1
        else:
            groups.append([text, 1])
    out = b""
    for text, count in groups:
        if ("d" in flags and count < 2) or ("u" in flags and count > 1):
            continue
        out += (b"%7d " % count if "c" in flags else b"") + text + b"\n"
    return out, b"", 0


# ---------------------------------------------------------------------------------------------------- tr

_TR_CLASSES = {"upper": b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "lower": b"abcdefghijklmnopqrstuvwxyz",
               "digit": b"0123456789", "space": b" \t\n\v\f\r", "blank": b" \t",
               "alpha": b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
               "alnum": b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}
_TR_ESCAPES = {"n": 10, "t": 9, "r": 13, "\\": 92, "v": 11, "f": 12, "a": 7, "b": 8}


def _tr_set(spec: str) -> bytes:
    """A tr SET: characters, `\\n`-style escapes, ranges `a-z` and classes `[:upper:]`."""
    chars, i, raw = [], 0, spec.encode()
    while i < len(raw):
        m = re.match(rb"\[:(\w+):\]", raw[i:])
        if m:
            if m.group(1).decode() not in _TR_CLASSES:
                raise _Usage(f"tr: invalid character class '{m.group(1).decode()}'\n")
            chars.extend(_TR_CLASSES[m.group(1).decode()])
            i += m.end()
            continue
        c, i = raw[i], i + 1
        if c == 92 and i < len(raw):
            c, i = _TR_ESCAPES.get(chr(raw[i]), raw[i]), i + 1
        if i + 1 < len(raw) and raw[i] == ord("-"):
            end = raw[i + 1]
            if end < c:
                raise _Usage(f"tr: range-endpoints of '{chr(c)}-{chr(end)}' are in reverse collating sequence "
                             "order\n")
            chars.extend(range(c, end + 1))
            i += 2
            continue
        chars.append(c)
    return bytes(chars)


def tr(argv: list[str], stdin: Stdin, read: Reader) -> Result:
    """`tr SET1 SET2`, `tr -d SET1`, `tr -s SET1 [SET2]` (and -ds) on stdin, as GNU tr in the C locale. Like
    GNU tr, upper/lower classes pair up case for case, and a short SET2 repeats its last character."""
    flags, sets = set(), []
    for word in argv[1:]:
        if word.startswith("-") and len(word) > 1 and not sets:
            for letter in word[1:]:
                if letter not in "ds":
                    return b"", str(_unsupported("tr", "-" + letter)).encode(), 1
                flags.add(letter)
        else:
            sets.append(word)
    wanted = {frozenset("d"): (1,), frozenset("s"): (1, 2)}.get(frozenset(flags), (2,))  # translate, -ds: 2
    if len(sets) not in wanted:
        return b"", (f"tr: {'missing operand' if len(sets) < 2 else 'extra operand'}\n"
                     "Try 'tr --help' for more information.\n").encode(), 1
    try:
        set1, set2 = _tr_set(sets[0]), _tr_set(sets[1]) if len(sets) > 1 else b""
    except _Usage as exc:
        return b"", str(exc).encode(), 1
    data = stdin() if callable(stdin) else stdin
    if "d" in flags:
        data = data.translate(None, set1)
        squeeze = set2
    else:
        if set2:
            padded = set2 + set2[-1:] * max(len(set1) - len(set2), 0)
            table = bytearray(range(256))
            for a, b in zip(set1, padded):
                table[a] = b
            data = data.translate(bytes(table))
        squeeze = set2 if set2 else set1
    if "s" in flags and squeeze:
        data = re.sub(b"([" + b"".join(re.escape(bytes([c])) for c in set(squeeze)) + b"])\\1+", rb"\1", data)
    return data, b"", 0


FILTERS: dict[str, Callable[[list[str], Stdin, Reader], Result]] = {
    "grep": grep, "head": head, "tail": tail, "wc": wc, "sort": sort, "cut": cut, "tr": tr, "uniq": uniq}
