"""The emulated host's shell as an engineer pokes at it: pipes into grep/head/tail/wc/sort/cut (held byte for byte
to this machine's real GNU grep 3.8 / coreutils 9.1 in the C locale, the independent peer), an interactive login
shell under a pty (paramiko's invoke_shell and the stock OpenSSH client), and SFTP/scp over the host's files."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from devices.emulated import coreutils

_C = {**os.environ, "LC_ALL": "C"}
_TEXT = (b"eth0 UP 100\nlo UNKNOWN 0\nens1f0np0 DOWN 25\nens1f1np1 UP 9\n\nfoo_bar up-link 7.5\n"
         b"Foo bar baz -3\nx\tTAB\tfield\n10 apples\n2 pears\n10 apples\n")
_FILES = {"a.txt": b"alpha\nbeta\ngamma\n", "b.txt": b"beta 2\nno newline at end"}

CASES = [
    ["grep", "UP"], ["grep", "-i", "up"], ["grep", "-v", "UP"], ["grep", "-c", "UP"], ["grep", "-n", "a"],
    ["grep", "-w", "up"], ["grep", "-iw", "up"], ["grep", "-x", "x\tTAB\tfield"], ["grep", "-E", "UP|DOWN"],
    ["grep", "UP\\|DOWN"], ["grep", "-E", "^[0-9]+ "], ["grep", "^[[:digit:]]\\+ "], ["grep", "-F", "7.5"],
    ["grep", "7.5"], ["grep", "-F", "-e", "lo", "-e", "pears"], ["grep", "-e", "nomatch"], ["grep", "-q", "UP"],
    ["grep", "-q", "nomatch"], ["grep", "-cv", "a"], ["grep", "-E", "(ab|ba)r"], ["grep", "\\(ab\\|ba\\)r"],
    ["grep", "-E", "a{2}"], ["grep", "ba*z"], ["grep", "*"], ["grep", "[]x]"], ["grep", "-in", "foo"],
    ["grep", "\\<up\\>"], ["grep", "-E", "p{1,2}"], ["grep", ""], ["grep", "-e", "UP", "a.txt", "b.txt"],
    ["grep", "-c", "beta", "a.txt", "b.txt"], ["grep", "end", "b.txt"], ["grep", "-h", "beta", "a.txt", "b.txt"],
    ["grep", "x", "missing.txt"], ["grep", "-s", "x", "missing.txt", "a.txt"],
    ["head"], ["head", "-n", "3"], ["head", "-3"], ["head", "-n3"], ["head", "-n", "-9"], ["head", "-n", "0"],
    ["head", "-n", "1", "a.txt", "b.txt"], ["head", "-n", "5", "b.txt"],
    ["tail"], ["tail", "-n", "2"], ["tail", "-2"], ["tail", "-n", "+10"], ["tail", "-n", "0"], ["tail", "-1", "b.txt"],
    ["wc"], ["wc", "-l"], ["wc", "-w"], ["wc", "-c"], ["wc", "-lw"], ["wc", "-l", "-c"], ["wc", "a.txt"],
    ["wc", "-l", "a.txt"], ["wc", "a.txt", "b.txt"], ["wc", "-w", "a.txt", "b.txt"], ["wc", "-l", "missing.txt"],
    ["sort"], ["sort", "-r"], ["sort", "-n"], ["sort", "-nr"], ["sort", "-u"], ["sort", "-n", "-u"],
    ["sort", "-rn", "-u"], ["sort", "b.txt", "a.txt"],
    ["cut", "-f", "2"], ["cut", "-d", " ", "-f", "1"], ["cut", "-d", " ", "-f", "2-"], ["cut", "-d ", "-f1,3"],
    ["cut", "-d", " ", "-f", "-2", "-s"], ["cut", "-d:", "-f", "1"], ["cut", "-d", " ", "-f", "3", "a.txt"],
]


@pytest.fixture(scope="module")
def filedir(tmp_path_factory):
    where = tmp_path_factory.mktemp("filters")
    for name, content in _FILES.items():
        (where / name).write_bytes(content)
    return where


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a))
def test_filter_matches_the_real_tool_byte_for_byte(argv, filedir):
    real_tool = shutil.which(argv[0])
    if real_tool is None:
        pytest.skip(f"no real {argv[0]} on this machine to compare with")
    real = subprocess.run([real_tool] + argv[1:], input=_TEXT, capture_output=True, env=_C, cwd=filedir, timeout=10)
    out, err, status = coreutils.FILTERS[argv[0]](argv, _TEXT, _FILES.get)
    assert (out, status) == (real.stdout, real.returncode)
    if real.stderr:  # the same complaint (a missing file), or at least one
        assert err == real.stderr or (err and "emulated host" not in err.decode())
    else:
        assert err == b""


def test_a_filter_with_file_operands_never_reads_stdin():
    def stdin() -> bytes:
        raise AssertionError("read stdin although files were named")
    for name in ("grep", "head", "tail", "wc", "sort", "cut"):
        argv = {"grep": ["grep", "a"], "cut": ["cut", "-f1"]}.get(name, [name]) + ["a.txt"]
        assert coreutils.FILTERS[name](argv, stdin, _FILES.get)[2] == 0


def test_an_option_outside_the_emulated_set_is_refused_not_ignored():
    for argv in (["grep", "-o", "a"], ["sort", "-k2"], ["wc", "-L"], ["cut", "-c1"], ["head", "-c", "3"]):
        out, err, status = coreutils.FILTERS[argv[0]](argv, b"a\n", _FILES.get)
        assert out == b"" and status in (1, 2) and b"not supported" in err, argv
